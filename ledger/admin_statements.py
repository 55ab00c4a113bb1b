"""Finance's monthly statement of an organization in the admin (the API's `/orgs/{id}/statement`):
pick an org and a month, read it in credits, download it as CSV."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from accounts.models import Organization
from ledger.api.csv_renderer import StatementCsvRenderer
from ledger.api.serializers import StatementSerializer
from ledger.clock import ledger_now
from ledger.money import format_credits
from ledger.statements import MONTH_MESSAGE, MONTH_PATTERN, org_statement


class StatementForm(forms.Form):
    org = forms.ModelChoiceField(queryset=Organization.objects.order_by("slug"), label="Organization")
    month = forms.RegexField(regex=MONTH_PATTERN, required=False,
                             help_text="YYYY-MM (UTC); empty: the month in progress",
                             error_messages={"invalid": MONTH_MESSAGE})


def statement_view(request: HttpRequest, admin_context: dict[str, Any]) -> HttpResponse:
    if not request.user.has_perm("ledger.view_ledgertransaction"):
        raise PermissionDenied
    data = request.GET if "org" in request.GET else None
    this_month = ledger_now().strftime("%Y-%m")
    form = StatementForm(data, initial={"month": this_month})
    statement = None
    if form.is_valid():
        try:
            month = form.cleaned_data["month"] or this_month
            statement = StatementSerializer(org_statement(org=form.cleaned_data["org"], month=month)).data
        except ValueError as error:
            form.add_error("month", str(error))
    if statement is not None and request.GET.get("format") == "csv":
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response.content = StatementCsvRenderer().render(statement, renderer_context={"response": response})
        return response
    rows, in_progress = [], False
    if statement is not None:
        in_progress = statement["month"] == this_month  # ends now; a past month ends at its end (QA)
        rows = [("Opening balance", statement["opening"]["total"]), ("Issued", statement["issued"]),
                ("Refunded", statement["refunded"]),
                ("Consumed", -statement["consumed"]), ("Expired", -statement["expired"]),
                ("Voided", -statement["voided"]), ("Closing balance", statement["closing"]["total"])]
        rows = [(label, format_credits(amount)) for label, amount in rows]
        largest = max((line["amount"] for line in statement["consumption"]), default=0)
        for line in statement["consumption"]:
            line["credits"] = format_credits(line["amount"])
            line["bar"] = line["amount"] * 100 // largest if largest else 0  # % of the largest line
        for issue in statement["issues"]:
            issue["credits"] = format_credits(issue["amount"])
        for refund in statement["refunds"]:
            refund["credits"] = format_credits(refund["amount"])
    context = {**admin_context, "title": "Statement", "form": form, "statement": statement, "rows": rows,
               "in_progress": in_progress, "query": request.GET.urlencode()}
    return TemplateResponse(request, "admin/ledger/bucket/statement.html", context)
