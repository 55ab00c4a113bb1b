"""A statement as CSV (`?format=csv` or `Accept: text/csv`): one row per figure, spreadsheet-ready."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer

# A cell a spreadsheet would read as a formula (OWASP's "CSV injection"): finance's references and
# project slugs are free text, so they are written with a leading quote.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cell(text: str) -> str:
    return f"'{text}" if text.startswith(FORMULA_START) else text


HEADER = ("section", "project", "gpu_type", "reference", "amount_micro_credits", "gpu_hours", "at")


class StatementCsvRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: dict[str, Any] | None = None) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if not isinstance(data, dict) or "opening" not in data:  # an error: its problem body, flat
            writer.writerows(sorted((data or {}).items()) if isinstance(data, dict) else [[data]])
            return out.getvalue().encode()
        response = (renderer_context or {}).get("response")
        if response is not None:
            response["Content-Disposition"] = (
                f'attachment; filename="gpubank-org-{data["org"]}-{data["month"]}.csv"')
        writer.writerow(HEADER)
        writer.writerow(("opening balance", "", "", "", data["opening"]["total"], "", data["starts_at"]))
        for part in ("available", "held"):  # held: promised to jobs queued or running then
            writer.writerow((f"opening {part}", "", "", "", data["opening"][part], "", data["starts_at"]))
        for issue in data["issues"]:
            writer.writerow(("issued", "", "", cell(issue["reference"]), issue["amount"], "", issue["at"]))
        for refund in data.get("refunds", []):  # reference names the job: refund:job:<id>:<key>
            writer.writerow(("refunded", "", "", cell(refund["reference"]), refund["amount"], "",
                             refund["at"]))
        for line in data["consumption"]:
            writer.writerow(("consumed", cell(line["project_slug"]), cell(line["gpu_type"]), "",
                             line["amount"], line["gpu_hours"], ""))
        for name in ("issued", "refunded", "consumed", "expired", "voided"):
            writer.writerow((f"total {name}", "", "", "", data[name], "", ""))
        writer.writerow(("closing balance", "", "", "", data["closing"]["total"], "", data["ends_at"]))
        for part in ("available", "held"):
            writer.writerow((f"closing {part}", "", "", "", data["closing"][part], "", data["ends_at"]))
        writer.writerow(("status", "", "", "final" if data["final"] else "provisional", "", "", ""))
        return out.getvalue().encode()
