"""The signed-in user's API keys page: list, make (the secret is shown once) and revoke.

The same services as `/api/v1/api-keys` (`accounts.services.create_own_api_key`,
`revoke_api_key`): the same limit, audit events and rules.
"""

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import ApiKey
from accounts.selectors import own_api_keys, usable_api_keys
from accounts.services import AccountsError, TooManyKeys, create_own_api_key, key_state, revoke_api_key
from config.api.errors import IdempotencyKeyInFlight, IdempotencyKeyReused
from config.api.idempotency import run_once
from config.form_keys import FormKeyField, new_form_key
from config.text import has_control_characters

ENDED_SHOWN = 20  # revoked or expired keys listed under the usable ones, newest first
LIFETIMES = [("30", "30 days"), ("90", "90 days"), ("365", "1 year"), ("", "Never expires")]


class NewKeyForm(forms.Form):
    """`key` is made when the page is shown: the same form sent twice (a double click, a resent
    POST) makes one key (QA: it made two)."""

    name = forms.CharField(max_length=100, strip=True, help_text="What the key is for, e.g. laptop or CI.")
    lifetime = forms.ChoiceField(choices=LIFETIMES, initial="90", required=False, label="Expires in")
    key = FormKeyField()

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if has_control_characters(name):
            raise forms.ValidationError("Control characters are not allowed.")
        return name

    def expires_at(self) -> timezone.datetime | None:
        days = self.cleaned_data.get("lifetime")
        return timezone.now() + timedelta(days=int(days)) if days else None


def _new_form() -> NewKeyForm:
    return NewKeyForm(initial={"key": new_form_key()})


def _page(request: HttpRequest, form: NewKeyForm, *, new_key: str | None = None, new_name: str = "",
          made_name: str = "", status: int = 200) -> HttpResponse:
    now = timezone.now()
    mine = own_api_keys(request.user)
    usable = usable_api_keys(request.user, now)
    # Review: revoked keys piled up on the page for ever; the most recent ones are enough.
    keys = [*usable, *mine.exclude(pk__in=usable.values("pk"))[:ENDED_SHOWN]]
    for key in keys:
        key.state = key_state(key, now)
    return render(request, "portal/keys.html", {
        "form": form, "keys": keys, "new_key": new_key, "new_name": new_name, "made_name": made_name,
    }, status=status)


# The new key's secret goes from the POST to the GET it redirects to (`?made=<key id>`) in a
# signed cookie of this path only, one per key (`gpubank_new_api_key_<id>`), read once: it never
# sits in the session table, a reload neither shows it again nor (as a reload of a POST answer
# would) makes a second key, and keys made in two tabs at once each show their own (QA: one
# cookie for all, the second key's secret was shown in both tabs, the first's never).
NEW_KEY_COOKIE = "gpubank_new_api_key_"
NEW_KEY_SALT = "portal.api-keys.new"
NEW_KEY_SECONDS = 120


def _shown_once(request: HttpRequest) -> tuple[ApiKey | None, str | None]:
    """(the key just made, its secret) when `?made=` names the user's usable key; the secret only
    when its cookie is here (a reload, or the answer to the same form sent twice, has none)."""
    made = request.GET.get("made", "")
    if not (made.isascii() and made.isdigit()) or len(made) > 18:  # review: "²" was a 500
        return None, None
    # A usable key only (review: one revoked in another tab before this GET was shown as new).
    key = usable_api_keys(request.user, timezone.now()).filter(pk=int(made)).first()
    if key is None:
        return None, None
    value = request.get_signed_cookie(f"{NEW_KEY_COOKIE}{made}", default=None, salt=NEW_KEY_SALT,
                                      max_age=NEW_KEY_SECONDS)
    user_id, key_id, raw = (value or "::").split(":", 2)
    if (user_id, key_id) != (str(request.user.pk), made) or not raw:
        return key, None
    return key, raw


def _make_key(request: HttpRequest, form: NewKeyForm, path: str) -> tuple[int, str | None, bool]:
    """(the key's id, its secret, whether this form had made it already): at most one key per
    form key, as the API's Idempotency-Key (`run_once`; the record keeps the id, never the secret).
    Raises what `create_own_api_key` or the idempotency record refuse."""
    made: dict[str, str] = {}

    def effect() -> tuple[int, dict[str, int]]:
        key, made["raw"] = create_own_api_key(user=request.user, name=form.cleaned_data["name"],
                                              expires_at=form.expires_at(), via="portal")
        return 303, {"id": key.pk}

    fields = {"name": form.cleaned_data["name"], "lifetime": form.cleaned_data["lifetime"]}
    # Not "user:<id>", the API's principal: an Idempotency-Key its caller chose must not meet these.
    _, body, replayed = run_once(principal=f"portal:user:{request.user.pk}", key=form.cleaned_data["key"],
                                 body=fields, effect=effect, path=path)
    return int(body["id"]), made.get("raw"), replayed


@require_http_methods(["GET", "POST"])
@login_required
def api_keys(request: HttpRequest) -> HttpResponse:
    """GET: the user's keys (and a key just made, once). POST: make one, then back to the GET."""
    path = reverse("portal:api-keys")
    if request.method == "GET":
        new, raw = _shown_once(request)
        response = _page(request, _new_form(), new_key=raw, new_name=new.name if new and raw else "",
                         made_name=new.name if new and raw is None else "")
        made = request.GET.get("made", "")
        if made.isascii() and made.isdigit() and len(made) <= 18:  # shown or not, it is read once
            response.delete_cookie(f"{NEW_KEY_COOKIE}{made}", path=path, samesite="Strict")
        if raw is not None:
            response["Cache-Control"] = "no-store"  # the secret must not stay in a cache
        return response
    form = NewKeyForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    try:
        key_id, raw, replayed = _make_key(request, form, path)
    except (TooManyKeys, AccountsError) as error:
        form.add_error(None, error.detail)
        return _page(request, form, status=409 if isinstance(error, TooManyKeys) else 400)
    except IdempotencyKeyReused:
        # This form made a key already and was sent back edited: the same fields in a new form (a
        # new key), which makes another key if sent.
        again = NewKeyForm({**request.POST.dict(), "key": new_form_key()})
        again.is_valid()
        again.add_error(None, "This form was sent already and made a key; it makes no other. Send this "
                        "one to make another.")
        return _page(request, again, status=409)
    except IdempotencyKeyInFlight:
        # The first send of this form is still making its key: the same form, its key kept, so
        # sending it again answers with that key (review: a new key here made a second one).
        again = NewKeyForm(request.POST)
        again.is_valid()
        again.add_error(None, "This form is still being sent: send it again in a moment to see its key "
                        "(it makes no other).")
        return _page(request, again, status=409)
    response = HttpResponseRedirect(f"{path}?made={key_id}", status=303)
    if replayed:
        # The first answer set the secret's cookie (the browser sends it back with this request
        # if it kept it; the GET shows it then); nothing new was made.
        return response
    response.set_signed_cookie(
        f"{NEW_KEY_COOKIE}{key_id}", f"{request.user.pk}:{key_id}:{raw}", salt=NEW_KEY_SALT,
        max_age=NEW_KEY_SECONDS, path=path, httponly=True, samesite="Strict",
        secure=settings.SESSION_COOKIE_SECURE,
    )
    return response


@require_POST
@login_required
def revoke_key(request: HttpRequest, key_id: int) -> HttpResponse:
    """Revoke one of the user's keys (someone else's is a 404), then back to the list."""
    key = get_object_or_404(own_api_keys(request.user), pk=key_id)
    revoke_api_key(api_key=key, actor=request.user)
    return redirect("portal:api-keys")
