"""Browser-only middleware that API calls authenticated by a Bearer token skip.

A request to `/api/v1/` with `Authorization: Bearer …` is authenticated by its API key
(`ApiKeyAuthentication` answers 401 for any Bearer header it cannot verify; it never falls back to
a session), so it needs no session and no messages (X-Frame-Options stays: `check --deploy`). Every
other request — the portal, the admin, and session-authenticated browser calls to the API (where
DRF's SessionAuthentication still enforces CSRF) — runs these middleware unchanged. Under ASGI
(uvicorn, `async_mode`) the skip returns the next handler's awaitable as it is (review: it applied
only to the sync chain, so under uvicorn every Bearer call still loaded the session it sent).
"""

from typing import Any

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.auth.models import AnonymousUser
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest

API_PREFIX = "/api/v1/"


def is_bearer_api_call(request: HttpRequest) -> bool:
    if not request.path_info.startswith(API_PREFIX):
        return False
    header = request.META.get("HTTP_AUTHORIZATION", "")
    return header.partition(" ")[0].lower() == "bearer"  # any case, as ApiKeyAuthentication reads it


async def _anonymous() -> AnonymousUser:
    return AnonymousUser()


class ApiSessionMiddleware(SessionMiddleware):
    def __call__(self, request: HttpRequest) -> Any:
        if is_bearer_api_call(request):
            return self.get_response(request)
        return super().__call__(request)


class ApiAuthenticationMiddleware(AuthenticationMiddleware):
    def __call__(self, request: HttpRequest) -> Any:
        if is_bearer_api_call(request):
            # No session to read a user from; DRF sets the key's user on the request.
            request.user = AnonymousUser()
            request.auser = _anonymous
            return self.get_response(request)
        return super().__call__(request)


class ApiMessageMiddleware(MessageMiddleware):
    def __call__(self, request: HttpRequest) -> Any:
        if is_bearer_api_call(request):
            return self.get_response(request)
        return super().__call__(request)
