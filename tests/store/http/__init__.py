"""Tests of the store server, its client, auth and CLI."""
