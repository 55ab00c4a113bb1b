"""`Authorization: Bearer <api key>` authentication for DRF."""

import hmac
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.keys import hash_key, parse_prefix
from accounts.models import ApiKey


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme != self.keyword:
            return None
        raw = raw.strip()
        prefix = parse_prefix(raw)
        if prefix is None:
            raise exceptions.AuthenticationFailed("Malformed API key.")
        key = ApiKey.objects.select_related("user").filter(prefix=prefix).first()
        if key is None or not hmac.compare_digest(key.key_hash, hash_key(raw)):
            raise exceptions.AuthenticationFailed("Invalid API key.")
        now = timezone.now()
        if key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("API key revoked.")
        if key.expires_at is not None and key.expires_at <= now:
            raise exceptions.AuthenticationFailed("API key expired.")
        if not key.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive.")
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
