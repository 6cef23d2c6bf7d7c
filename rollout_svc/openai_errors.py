"""The OpenAI-compatible API's errors: OpenAI's error shape, and a 400 naming its field."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An answer other than 200, in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (
            status,
            message,
            param,
            kind,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)
