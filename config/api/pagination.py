"""Page-number pagination with a bounded, client-chosen page size."""

from typing import Any

from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination

from config.api.errors import PageOutOfRange


class ApiPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list[Any] | None:
        """As DRF's, but a page past the last one is a 404 `not-found` that names the page asked
        and the last one ("Page 7 is past the last page (3).", with `page` and `last_page`), not
        DRF's bare "Invalid page." A list with no row has one page, empty. Page 0, negative and
        non-numeric pages are 400s before this, from each list's query serializer."""
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound as exc:
            raise self._why(queryset, request) from exc

    def _why(self, queryset: Any, request: Any) -> Exception:
        """What was wrong with the page asked (only on a refusal: the count is read again)."""
        asked = self.get_page_number(request, None)
        try:
            number = int(asked)
        except ValueError:
            return NotFound(f"Page {asked!r} is not a page number.")
        if number < 1:  # only reached without the list's query serializer
            return NotFound(f"Page {number} is not a page: pages start at 1.")
        pages = self.django_paginator_class(queryset, self.get_page_size(request)).num_pages
        return PageOutOfRange(number, pages)
