"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions API, for tests.

Tests talk to it through litellm exactly as users talk to a local OpenAI-compatible server
(`model="openai/<anything>", api_base=server.url`), so the whole client path (HTTP, JSON, SSE
streaming, error mapping, retries, timeouts) is real. Nothing is mocked inside litellm.

Scripting API
-------------
    from fake_llm_server import FakeLLMServer, Reply, fake_llm   # importing `fake_llm` registers the fixture

    with FakeLLMServer() as srv:             # or the `fake_llm` pytest fixture (started, closed after)
        srv.url                              # "http://127.0.0.1:<port>/v1"  -> api_base
        srv.push(Reply(content="```cuda\\n...\\n```"))          # queue replies, consumed in order
        srv.push(Reply(status=429, retry_after=0.2), Reply(content="..."))
        srv.push(lambda req: Reply(content=make_kernel(req)))  # a callable gets the request JSON
        srv.default = Reply(content="...")   # used when the queue is empty (default: HTTP 500
                                             # "no scripted reply", so a test sees unplanned calls)
        srv.requests                         # list[dict] of every chat request body, in order
        srv.count                            # len(srv.requests)
        srv.prompts()                        # the user-message text of each request

    Reply(content="text", status=200, delay_s=0.0, retry_after=None, headers={},
          prompt_tokens=None, completion_tokens=None,   # None: counted as whitespace words
          finish_reason="stop", error_message=None, stream_chunk_chars=16)

  * status != 200 answers an OpenAI-style error body {"error": {"message", "type", "code"}}
    (with a Retry-After header when retry_after is set);
  * delay_s sleeps before answering (a slow model; interrupted when the server closes);
  * finish_reason="length" with content ending mid-fence is a truncated answer;
  * requests with "stream": true get Server-Sent Events: content split into chunks of
    stream_chunk_chars, a final chunk with finish_reason, a usage chunk when
    stream_options.include_usage is set, then "data: [DONE]".
  * GET /v1/models (and /models) lists one model, so reachability checks work.
"""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Union

import pytest


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    retry_after: float | None = None
    headers: dict = field(default_factory=dict)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = "stop"
    error_message: str | None = None
    stream_chunk_chars: int = 16


Script = Union[Reply, Callable[[dict], Reply]]


def _words(s: str) -> int:
    return len(s.split())


class FakeLLMServer:
    """See the module docstring. Thread-safe; one instance per test."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._queue: deque[Script] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.default: Script = Reply(status=500, error_message="no scripted reply")
        self.requests: list[dict] = []
        self.request_times: list[float] = []
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public API

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def push(self, *replies: Script) -> "FakeLLMServer":
        with self._lock:
            self._queue.extend(replies)
        return self

    def prompts(self) -> list[str]:
        out = []
        for r in list(self.requests):
            msgs = [m for m in r.get("messages", []) if m.get("role") == "user"]
            c = msgs[-1]["content"] if msgs else ""
            out.append(c if isinstance(c, str) else json.dumps(c))
        return out

    def start(self) -> "FakeLLMServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True, name=f"fake-llm-{self.port}")
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "FakeLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --------------------------------------------------------------------- serving

    def _next(self, body: dict) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.request_times.append(time.monotonic())
            item = self._queue.popleft() if self._queue else self.default
        return item(body) if callable(item) else item

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep test output clean
                pass

            def _send(self, status: int, obj: dict, headers: dict | None = None) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, str(v))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": "fake-model", "object": "model", "owned_by": "tests"}]})
                else:
                    self._send(404, {"error": {"message": "not found", "type": "not_found"}})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b"{}"
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}",
                                               "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "bad json", "type": "invalid_request"}})
                    return
                reply = server._next(body)
                if reply.delay_s and server._closing.wait(reply.delay_s):
                    return
                try:
                    self._answer(body, reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): that is the point of slow replies

            def _answer(self, body: dict, r: Reply) -> None:
                headers = dict(r.headers)
                if r.retry_after is not None:
                    headers["Retry-After"] = f"{r.retry_after:g}"
                if r.status != 200:
                    kind = {429: "rate_limit_exceeded", 500: "server_error",
                            503: "server_error", 401: "invalid_api_key"}.get(r.status, "error")
                    self._send(r.status, {"error": {
                        "message": r.error_message or f"scripted HTTP {r.status}",
                        "type": kind, "code": kind}}, headers)
                    return
                model = body.get("model", "fake-model")
                ptok = r.prompt_tokens if r.prompt_tokens is not None else sum(
                    _words(m.get("content") or "") for m in body.get("messages", [])
                    if isinstance(m.get("content"), str))
                ctok = r.completion_tokens if r.completion_tokens is not None else _words(r.content)
                usage = {"prompt_tokens": ptok, "completion_tokens": ctok,
                         "total_tokens": ptok + ctok}
                rid = f"chatcmpl-fake{server.count}"
                if not body.get("stream"):
                    self._send(200, {
                        "id": rid, "object": "chat.completion", "created": int(time.time()),
                        "model": model, "usage": usage,
                        "choices": [{"index": 0, "finish_reason": r.finish_reason,
                                     "message": {"role": "assistant", "content": r.content}}]},
                        headers)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                for k, v in headers.items():
                    self.send_header(k, str(v))
                self.end_headers()
                self.close_connection = True

                def event(obj):
                    self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    self.wfile.flush()

                base = {"id": rid, "object": "chat.completion.chunk",
                        "created": int(time.time()), "model": model}
                event({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                  "content": ""},
                                            "finish_reason": None}]})
                step = max(1, r.stream_chunk_chars)
                for i in range(0, len(r.content), step):
                    event({**base, "choices": [{"index": 0,
                                                "delta": {"content": r.content[i:i + step]},
                                                "finish_reason": None}]})
                event({**base, "choices": [{"index": 0, "delta": {},
                                            "finish_reason": r.finish_reason}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    event({**base, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        return Handler


@pytest.fixture
def fake_llm():
    """A started FakeLLMServer, closed after the test."""
    with FakeLLMServer() as srv:
        yield srv
