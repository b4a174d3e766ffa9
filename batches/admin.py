from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from batches.models import Batch, BatchItem

# A batch holds up to 5,000 items: its page shows this many at a time, in
# submitted order (`?items=N`, from 1), never all of them with their jobs.
ITEMS_PER_PAGE = 50
PAGE_PARAM = "items"


@dataclass(frozen=True)
class ItemsPage:
    number: int  # from 1
    pages: int
    count: int

    @property
    def start(self) -> int:
        """The first item's index (items are numbered 0..count-1 at admission)."""
        return (self.number - 1) * ITEMS_PER_PAGE

    @property
    def stop(self) -> int:
        return min(self.start + ITEMS_PER_PAGE, self.count)

    def summary(self) -> str:
        shown = f"{self.start + 1} to {self.stop}" if self.count else "0"
        return f"Items {shown} of {self.count:,} (page {self.number} of {self.pages})"

    def links(self) -> list[tuple[str, str]]:
        """(label, query) of the other pages worth a link."""
        wanted = [
            ("first", 1),
            ("previous", self.number - 1),
            ("next", self.number + 1),
            ("last", self.pages),
        ]
        return [
            (label, f"?{PAGE_PARAM}={n}")
            for label, n in wanted
            if 1 <= n <= self.pages and n != self.number
        ]


def items_page(request: HttpRequest, batch: Batch) -> ItemsPage:
    """The page asked for; past the end the last, not a number the first."""
    pages = max(1, -(-batch.item_count // ITEMS_PER_PAGE))
    try:
        number = int(request.GET.get(PAGE_PARAM, "1"))
    except ValueError:
        number = 1
    return ItemsPage(number=min(max(number, 1), pages), pages=pages, count=batch.item_count)


class BatchItemInline(admin.TabularInline):
    model = BatchItem
    fields = ("index", "custom_id", "job", "job_status", "metadata")
    readonly_fields = fields
    can_delete = False
    extra = 0
    show_change_link = False

    @admin.display(description="status")
    def job_status(self, item: BatchItem) -> str:
        return item.job.status

    # Items are made by `batch_create`, with their jobs and charges; a form can do neither.
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "tenant",
        "status",
        "priority",
        "item_count",
        "characters",
        "archive_status",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "archive_status", "priority"]
    search_fields = ["=id"]
    list_select_related = ["tenant"]
    readonly_fields = [f.name for f in Batch._meta.fields]
    inlines = [BatchItemInline]

    def get_formset_kwargs(
        self, request: HttpRequest, obj: Any, inline: Any, prefix: str
    ) -> dict[str, Any]:
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, BatchItemInline) and obj is not None:
            # One page of items, by index: the (batch, index) constraint's index
            # finds it directly (the formset adds the batch).
            page = items_page(request, obj)
            kwargs["queryset"] = (
                kwargs["queryset"]
                .filter(index__gte=page.start, index__lt=page.stop)
                .select_related("job")
                .order_by("index")
            )
        return kwargs

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        if obj is not None:
            context["items_page"] = items_page(request, obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    # A batch is submitted through the API (checked, charged, run), ended by its
    # items or a cancel, never edited by hand.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    # Its items' grouping, manifest and archive would go; the jobs stay either way.
    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
