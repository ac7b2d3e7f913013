"""One self-contained HTML page: inline CSS, no script, no font or image fetched, so it opens from disk
in any browser and can be attached to a bug report; written with :func:`save_page` under the rules of
``--json`` (a link refused, a new file renamed into place).

Every text put on the page goes through :func:`ddpdoctor.report.svg.text` (redacted, escaped); only
markup built here or by :mod:`ddpdoctor.report.svg` is inserted as it is.
"""

from __future__ import annotations

from typing import Sequence

from ddpdoctor.report.svg import text

__all__ = ["page", "section", "table", "preformatted", "save_page", "write_page", "STYLE"]

STYLE = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
.verdict{border-left:6px solid #c00;background:#fff4f4;padding:10px 14px}.verdict.ok{border-color:#2a2;background:#f4fff4}
.verdict p{margin:4px 0}.headline{font-size:18px;font-weight:600}.fix{color:#063}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px;white-space:pre-wrap}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#eee}td.l,th.l{text-align:left}.muted{color:#666;font-size:12px}.scroll{overflow-x:auto}"""


def page(title: str, body: Sequence[str]) -> str:
    """The document: ``title`` (text) and ``body`` (markup made by this module or :mod:`ddpdoctor.report.svg`)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>{text(title)}</title><style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def section(title: str, *parts: str, key: str = "") -> str:
    """A titled part of the page (``parts``: markup)."""
    ident = f' id="{text(key)}"' if key else ""
    return f"<section{ident}><h2>{text(title)}</h2>" + "".join(parts) + "</section>"


LEFT = ' class="l"'


def table(header: Sequence[str], rows: Sequence[Sequence[object]], left: int = 1, cls: str = "") -> str:
    """A table of text cells; the first ``left`` columns aligned left."""
    def cells(tag: str, values: Sequence[object]) -> str:
        return "".join(f'<{tag}{LEFT if i < left else ""}>{text(v)}</{tag}>' for i, v in enumerate(values))
    klass = f' class="{text(cls)}"' if cls else ""
    return (f"<div class=\"scroll\"><table{klass}><tr>{cells('th', header)}</tr>"
            + "".join(f"<tr>{cells('td', r)}</tr>" for r in rows) + "</table></div>")


def preformatted(lines: Sequence[str]) -> str:
    return "<pre>" + "\n".join(text(line) for line in lines) + "</pre>"


def save_page(path: str, html_text: str, flag: str = "--html") -> None:
    """Write the page to ``path`` as ``--json`` writes its file: a symbolic link refused, a new file beside
    it renamed into place (readers never see half a page; an existing file's permissions kept).

    Raises:
        UsageError: ``path`` is a link or not a regular file.
        OSError: the folder cannot be written (disk full, permissions).
    """
    from ddpdoctor.report.document import write_file_atomically

    write_file_atomically(path, html_text, flag)


def write_page(path: str, html_text: str, code: int) -> int:
    """Write ``--html`` once the terminal report is out; the command's exit code (as ``--json``'s
    :func:`ddpdoctor.report.document.save_json`: a page that cannot be written is one line on standard
    error, and 74 when the verdict was 0)."""
    from ddpdoctor.report.document import said, save_output

    return said(*save_output(path, lambda: save_page(path, html_text), code, "--html"))
