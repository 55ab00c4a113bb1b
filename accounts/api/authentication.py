"""`Authorization: Bearer <api key>` authentication for DRF."""

import hmac
from typing import Any

from django.contrib.auth.models import Group
from django.db.models import Exists, OuterRef
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.keys import hash_key, parse_prefix
from accounts.models import ApiKey
from accounts.selectors import FINANCE_GROUP


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
        # The finance flag rides on the key lookup (one query; `is_finance` reads it from the user).
        key = (
            ApiKey.objects.select_related("user")
            .annotate(user_in_finance=Exists(
                Group.objects.filter(name=FINANCE_GROUP, user=OuterRef("user_id"))
            ))
            .filter(prefix=prefix)
            .first()
        )
        if key is None or not hmac.compare_digest(key.key_hash, hash_key(raw)):
            raise exceptions.AuthenticationFailed("Invalid API key.")
        now = timezone.now()
        if key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("API key revoked.")
        if key.expires_at is not None and key.expires_at <= now:
            raise exceptions.AuthenticationFailed("API key expired.")
        if not key.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive.")
        key.user._gpubank_is_finance = bool(key.user.is_superuser or key.user_in_finance)
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
