"""Which dashboard queries a store gets: keyset SQL for a SQL store, the protocol scan for any other.

Its own module so that the shared query models (store/dashboard_queries.py) never import the SQL
implementation that builds on them."""

from __future__ import annotations

from reinforge.store.dashboard_queries import DashboardQueries, ProtocolScanQueries
from reinforge.store.protocol import Store
from reinforge.store.sql.dashboard_queries import SqlDashboardQueries
from reinforge.store.sql.store import SqlStore


def dashboard_queries_for(store: Store) -> DashboardQueries:
    """The SQL queries for a SQL store, the protocol scan for any other."""
    if isinstance(store, SqlStore):
        return SqlDashboardQueries(store)
    return ProtocolScanQueries(store)


__all__ = ["dashboard_queries_for"]
