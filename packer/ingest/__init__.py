"""Stage 1a: read JSONL records with their file and line, and normalise their shape."""

from packer.ingest.formats import detect_format, parse_record
from packer.ingest.reader import read_lines
from packer.records import Conversation, Document, Part, Preference, RawLine, Response, Turn

__all__ = ["Conversation", "Document", "Part", "Preference", "RawLine", "Response", "Turn", "detect_format", "parse_record",
           "read_lines"]
