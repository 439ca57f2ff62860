"""``hpcsched db``: create or migrate the daemon's database schema."""

from __future__ import annotations

import click

from hpcsched.daemon.store.schema import safe_url
from hpcsched.daemon.store.store import Store


def _resolve_url(database_url: str | None, config_path: str | None) -> str:
    if database_url:
        return database_url
    from hpcsched.daemon.config import ConfigError, load

    try:
        return load(config_path).daemon.database_url
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


_url_option = click.option(
    "--database-url", metavar="URL",
    help="SQLAlchemy URL (default: the config's [daemon] database_url, or "
         "$HPCSCHED_DATABASE_URL).")
_config_option = click.option(
    "--config", "config_path", metavar="PATH", type=click.Path(dir_okay=False),
    help="daemon config file (default: $HPCSCHED_CONFIG, else /etc/hpcsched/hpcsched.toml).")


@click.group("db")
def db_group() -> None:
    """The daemon's database: create or migrate its schema."""


@db_group.command("upgrade")
@_url_option
@_config_option
def db_upgrade(database_url: str | None, config_path: str | None) -> None:
    """Create or migrate the schema; prints the revision reached.

    Safe to repeat; creates a SQLite file's directory when missing."""
    url = _resolve_url(database_url, config_path)
    store = Store(url)
    try:
        click.echo(store.upgrade())
    except Exception as exc:  # one line, not a traceback, for an operator
        raise click.ClickException(f"{safe_url(url)}: upgrade failed: {exc}") from exc
    finally:
        store.close()


@db_group.command("current")
@_url_option
@_config_option
def db_current(database_url: str | None, config_path: str | None) -> None:
    """Print the schema revision ("none": never migrated)."""
    url = _resolve_url(database_url, config_path)
    store = Store(url)
    try:
        click.echo(store.current_revision() or "none")
    except Exception as exc:
        raise click.ClickException(f"{safe_url(url)}: {exc}") from exc
    finally:
        store.close()
