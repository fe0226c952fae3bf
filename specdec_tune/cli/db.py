"""``specdec-tune db upgrade`` and ``specdec-tune db current``: the results database schema."""

from __future__ import annotations

import typer

from specdec_tune.cli._app import app, print_json
from specdec_tune.cli._options import DbOption

__all__ = ["DbOption", "db_app"]

db_app = typer.Typer(
    help="Manage the results database (SQLite or PostgreSQL) and its schema migrations.",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")

JsonOption = typer.Option(False, "--json", help="Print one JSON object instead of text.")


def _show(revision: str | None) -> str:
    return revision if revision is not None else "none (empty database)"


@db_app.command("upgrade")
def upgrade_cmd(db: DbOption = None, as_json: bool = JsonOption) -> None:
    """Create the database or migrate it to the newest schema; stored results are kept."""
    # Imported here so that `specdec-tune --help` does not pay for SQLAlchemy and Alembic.
    from specdec_tune.db import head_revision, mask_url, resolve_url, upgrade

    url = resolve_url(db)
    before, after = upgrade(url)
    if as_json:
        print_json(
            {"url": mask_url(url), "before": before, "after": after, "head": head_revision()}
        )
        return
    typer.echo(f"database: {mask_url(url)}")
    typer.echo(f"revision before: {_show(before)}")
    state = "already at head" if before == after else "upgraded"
    typer.echo(f"revision after:  {_show(after)} ({state})")


@db_app.command("current")
def current_cmd(db: DbOption = None, as_json: bool = JsonOption) -> None:
    """Show the database's schema revision and whether it needs `db upgrade` (changes nothing)."""
    from specdec_tune.db import current_revision, head_revision, mask_url, resolve_url

    url = resolve_url(db)
    current, head = current_revision(url), head_revision()
    if as_json:
        print_json({"url": mask_url(url), "current": current, "head": head,
                    "up_to_date": current == head})  # fmt: skip
        return
    typer.echo(f"database: {mask_url(url)}")
    typer.echo(f"revision: {_show(current)}")
    note = (
        "up to date" if current == head else "run `specdec-tune db upgrade` (done on first use too)"
    )
    typer.echo(f"head:     {head} ({note})")
