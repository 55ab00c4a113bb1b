from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    name = "budgets"
