"""How the commands print a table of rows: :func:`print_table`."""

from __future__ import annotations

__all__ = ["print_table"]


def print_table(rows: list[dict], columns: list[str]) -> None:
    """``rows`` as a ``rich`` table of ``columns`` on stdout (floats to 3 decimals). Off a terminal the
    table is as wide as its longest cells (nothing wrapped or cut), so output stays greppable."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    def cell(v: object) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    cells = [[cell(r.get(c, "")) for c in columns] for r in rows]
    table = Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, highlight=False)
    for row in cells:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
        console = Console(width=sum(widths) + 3 * len(widths) + 2, soft_wrap=False)
    console.print(table)
