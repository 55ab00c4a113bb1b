"""API v1 routes, gathered from each app's api package."""

urlpatterns: list = []
