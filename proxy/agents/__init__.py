"""Agent decoders: what an agent meant by the tool calls tooltap recorded.

`decode_session(turns)` is the entry point (see `session.py`); one module per agent family
(`cline`, `cline_sdk`, `claude_code`, `generic`) behind `base.Agent`, listed in `registry`.
"""

from .base import CallInput, SessionDecoding, TurnInput
from .session import decode_session, decode_turn

__all__ = ["CallInput", "TurnInput", "SessionDecoding", "decode_session", "decode_turn"]
