"""`Authorization: Bearer <api key>` authentication for DRF."""

import hmac
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.keys import hash_key, parse_prefix
from accounts.models import ApiKey
from accounts.selectors import FINANCE_GROUP


def _lookup(prefix: str) -> ApiKey | None:
    """The key with its user and the user's finance flag, in one statement (plain SQL: on the
    submission path the ORM's query compilation cost more than the query)."""
    user_model = get_user_model()
    key_fields = [f.attname for f in ApiKey._meta.concrete_fields]
    user_fields = [f.attname for f in user_model._meta.concrete_fields]
    through = user_model._meta.get_field("groups").remote_field.through._meta.db_table
    key_cols = ", ".join(f'k."{f.column}"' for f in ApiKey._meta.concrete_fields)
    user_cols = ", ".join(f'u."{f.column}"' for f in user_model._meta.concrete_fields)
    sql = (
        f"SELECT {key_cols}, {user_cols}, "  # noqa: S608 (identifiers from model metadata)
        f"EXISTS (SELECT 1 FROM {through} ug JOIN {Group._meta.db_table} g ON g.id = ug.group_id "
        "WHERE ug.user_id = u.id AND g.name = %s) "
        f"FROM {ApiKey._meta.db_table} k JOIN {user_model._meta.db_table} u ON u.id = k.user_id "
        "WHERE k.prefix = %s ORDER BY k.id LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [FINANCE_GROUP, prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    n = len(key_fields)
    key = ApiKey.from_db(connection.alias, key_fields, row[:n])
    user = user_model.from_db(connection.alias, user_fields, row[n:n + len(user_fields)])
    user._gpubank_is_finance = bool(user.is_superuser or row[-1])  # read by accounts.selectors.is_finance
    ApiKey._meta.get_field("user").set_cached_value(key, user)
    return key


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
        key = _lookup(prefix)
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
