"""Page-number pagination with a bounded, client-chosen page size."""

from typing import Any

from django.core.paginator import EmptyPage, InvalidPage
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
        self.request = request
        page_size = self.get_page_size(request)
        if not page_size:
            return None
        paginator = self.django_paginator_class(queryset, page_size)
        page_number = self.get_page_number(request, paginator)
        try:
            self.page = paginator.page(page_number)
        except EmptyPage as exc:
            if int(page_number) < 1:  # only reached without the list's query serializer
                raise NotFound(f"Page {page_number} is not a page: pages start at 1.") from exc
            raise PageOutOfRange(int(page_number), paginator.num_pages) from exc
        except InvalidPage as exc:
            raise NotFound(f"Page {page_number!r} is not a page number.") from exc
        if paginator.num_pages > 1 and self.template is not None:
            self.display_page_controls = True
        return list(self.page)
