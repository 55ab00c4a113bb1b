"""Browser pages: home (balances), one org, one job, the live dashboard, API keys, sign in/out."""

from django.contrib.auth import views as auth_views
from django.urls import path

from portal import keys, views

app_name = "portal"

urlpatterns = [
    path("", views.home, name="home"),
    path("orgs/<slug:slug>/", views.org_detail, name="org"),
    path("jobs/<int:job_id>/", views.job_detail, name="job"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("api-keys/", keys.api_keys, name="api-keys"),
    path("api-keys/<int:key_id>/revoke", keys.revoke_key, name="api-key-revoke"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="portal/login.html", redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="portal:login"), name="logout"),
]
