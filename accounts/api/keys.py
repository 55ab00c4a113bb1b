"""Self-service API keys: a user lists, makes and revokes their own (`/api/v1/api-keys`).

Making one needs a signed-in browser session (the portal's page, or this route from it): a
request authenticated by an API key may list and revoke, never make (decision 0014).

An admin's keys for someone else stay in the admin and `manage.py create_api_key`. The secret of
a new key is in the first answer only: the idempotency record stores the answer without it, so
a replay says the key was made (`key: null`) and no secret is kept anywhere.
"""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.api.serializers import ApiKeyCreatedSerializer, ApiKeyCreateSerializer, ApiKeySerializer
from accounts.models import ApiKey
from accounts.selectors import own_api_keys
from accounts.services import create_own_api_key, revoke_api_key
from config.api.idempotency import key_of, run_idempotent
from config.api.serializers import PageQuerySerializer, query_of


def _without_secret(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "key": None}


class ApiKeysView(GenericAPIView):
    serializer_class = ApiKeySerializer

    @extend_schema(operation_id="api_keys_list", parameters=[PageQuerySerializer],
                   responses=ApiKeySerializer(many=True),
                   description="The caller's own API keys, newest first (revoked and expired ones too).")
    def get(self, request: Request) -> Response:
        PageQuerySerializer(data=query_of(request)).is_valid(raise_exception=True)
        page = self.paginate_queryset(own_api_keys(request.user))
        return self.get_paginated_response(ApiKeySerializer(page, many=True).data)

    @extend_schema(
        operation_id="api_keys_create", request=ApiKeyCreateSerializer,
        responses={201: ApiKeyCreatedSerializer},
        description="Make an API key for the caller, from a signed-in browser session only (a request "
        "authenticated by an API key is 403: a key cannot make keys). `key` is the secret, in this answer "
        "only; a replay of the same request answers the same key as it was made, with `key: null` (if "
        "the first answer was lost, revoke that `id` and make another). At most "
        "`API_KEYS_MAX_ACTIVE_PER_USER` usable keys and `API_KEYS_MAX_CREATED_PER_DAY` new ones a day made "
        "by the user (an admin's for them do not count) "
        "(409 `too-many-api-keys`).")
    def post(self, request: Request) -> Response:
        key_of(request)
        if isinstance(request.auth, ApiKey):
            # Review: a leaked, short-lived or just-revoked key could mint a key that never
            # expires and outlives its revocation. Keys are made by a person, signed in.
            raise PermissionDenied(
                "An API key cannot make API keys: make one in the browser, signed in, at /api-keys/ "
                "(or with this route from a signed-in browser session)."
            )
        body = ApiKeyCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        name, expires_at = body.validated_data["name"], body.validated_data.get("expires_at")

        def effect() -> tuple[int, Any]:
            api_key, raw = create_own_api_key(user=request.user, name=name, expires_at=expires_at,
                                              via="api-session")
            return 201, {**ApiKeySerializer(api_key).data, "key": raw}

        response = run_idempotent(request, effect, redact=_without_secret)
        response["Cache-Control"] = "no-store"  # the first answer holds the secret
        return response


class ApiKeyRevokeView(GenericAPIView):
    serializer_class = ApiKeySerializer

    @extend_schema(operation_id="api_keys_revoke", request=None, responses=ApiKeySerializer,
                   description="Revoke one of the caller's keys (at once; revoking twice keeps the first "
                   "time). Another user's key is a 404.")
    def post(self, request: Request, key_id: int) -> Response:
        key_of(request)
        if request.data:
            raise ValidationError({"non_field_errors": ["Revoke takes no body."]})
        api_key = own_api_keys(request.user).filter(pk=key_id).first()
        if api_key is None:  # someone else's too: nobody learns which ids exist
            raise NotFound("No such API key.")

        def effect() -> tuple[int, Any]:
            return 200, ApiKeySerializer(revoke_api_key(api_key=api_key, actor=request.user)).data

        return run_idempotent(request, effect)
