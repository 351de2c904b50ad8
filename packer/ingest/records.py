"""The record shapes' old home: they live in :mod:`packer.records` (the ground floor); re-exported here so
``packer.ingest.records`` imports keep working."""

from packer.records import ROLES, Conversation, Document, Part, Preference, Response, Turn

__all__ = ["ROLES", "Conversation", "Document", "Part", "Preference", "Response", "Turn"]
