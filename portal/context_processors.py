"""What every page that extends `portal/base.html` needs for its navigation, in one place.

QA: each view set `can_see_dashboard` itself, and the job page forgot it: the "Live dashboard" link
was missing there for users allowed to see the dashboard.
"""

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from portal.access import dashboard_scope


def portal_nav(request: HttpRequest) -> dict[str, Any]:
    """`can_see_dashboard`: whether the nav links the live dashboard. Lazy: its queries run only
    when a template reads it (not for admin pages, or the API's browsable pages)."""
    return {"can_see_dashboard": SimpleLazyObject(lambda: dashboard_scope(request.user) is not None)}
