"""Waiting for a server started in another process until its URL answers (shared by the tests and
benchmarks/deploy.py, which puts this folder on its path as benchmarks/fuzz.py does)."""

from __future__ import annotations

import time
import urllib.request


def answers_within(url: str, timeout_s: float, *, poll_s: float = 0.2,
                   request_timeout_s: float = 1.0) -> bool:
    """Whether ``url`` answers a GET (an HTTP success) within ``timeout_s``: asked again every
    ``poll_s`` while the connection fails or the answer is an error."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout_s):
                return True
        except OSError:
            time.sleep(poll_s)
    return False
