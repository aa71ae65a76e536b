"""One turn's request and response, read once and shared by every decoder step."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .. import apis
from . import offered, transcript
from .base import TurnInput


@dataclass
class TurnView:
    turn: TurnInput
    # uid -> server name for Cline 3.x names, filled at session level before names decode.
    uids: dict[str, str] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return self.turn.api

    def _memo(self, name: str, compute):
        memo = self.turn.memo
        if name not in memo:
            memo[name] = compute()
        return memo[name]

    @cached_property
    def messages(self) -> list[transcript.Message]:
        return self._memo("messages", lambda: transcript.messages(self.turn.api, self.turn.request))

    @cached_property
    def resends_history(self) -> bool:
        """Whether the request repeats the conversation before it, as most do; one that
        continues an earlier answer by reference (Responses) sends only what is new."""
        api = apis.by_name(self.turn.api)
        return api is None or not isinstance(self.turn.request, dict) or not api.continues(self.turn.request)

    @cached_property
    def tools(self) -> dict[str, dict[str, Any]] | None:
        return self._memo("tools", lambda: offered.offered_tools(self.turn.request))

    @cached_property
    def system_text(self) -> str:
        return self._memo("system_text", lambda: "\n".join(
            t for m in self.messages if m.role == "system" for t in m.texts()))

    @cached_property
    def last_user(self) -> transcript.Message | None:
        """The newest user message: where Cline puts results, reminders and environment."""
        for m in reversed(self.messages):
            if m.role == "user":
                return m
            if m.role == "assistant":
                return None
        return None

    @cached_property
    def first_user(self) -> transcript.Message | None:
        return next((m for m in self.messages if m.role == "user"), None)

    @cached_property
    def response_text(self) -> str:
        return self._memo("response_text", lambda: transcript.response_text(self.turn.api, self.turn.response))
