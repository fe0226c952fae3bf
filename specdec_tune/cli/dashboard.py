"""``specdec-tune dashboard``: serve the Streamlit dashboard on the results database and study storage."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specdec_tune.cli._app import app
from specdec_tune.cli._options import DbOption

# The Streamlit script that wires the tuner's server room into the dashboard (run by path, not imported here).
APP_SCRIPT = Path(__file__).with_name("_dashboard_app.py")

StorageOption = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at run time on Python 3.10 too
    typer.Option(
        "--storage", envvar="SPECDEC_STORAGE", show_envvar=True, metavar="URL",
        help="Optuna storage of the tuning studies when it is not the tuner's default "
             "(e.g. sqlite:///studies.db or postgresql+psycopg://user:password@host/dbname).",
    ),
]


@app.command()
def dashboard(
    db: DbOption = None,
    storage: StorageOption = None,
    port: int = typer.Option(8501, "--port", help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host",
                             help="Address to bind; 0.0.0.0 makes the dashboard reachable from other machines."),
) -> None:
    """Open the results in a Streamlit dashboard (headless; prints the URL; Ctrl-C stops it)."""
    # Imported here so that `specdec-tune --help` does not pay for SQLAlchemy and Streamlit.
    from specdec_tune.dashboard import check_port, check_sources, resolve_sources, serve

    sources = resolve_sources(db, storage)
    check_port(host, port)
    check_sources(sources).close()  # creates or migrates (never wipes) the database; one line if it cannot

    def ready(url: str) -> None:
        typer.echo(f"dashboard: {url}  (results {sources.display_db}, studies {sources.display_storage}); "
                   "Ctrl-C stops it", err=False)

    code = serve(sources, host, port, ready, app=APP_SCRIPT)
    typer.echo("dashboard stopped")
    if code not in (0, -2, -15, 130):
        raise typer.Exit(code)
