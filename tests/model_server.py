"""A scripted model server on loopback that speaks the agents' APIs and returns a fixed edit.

It answers the Anthropic Messages API (Claude Code), the OpenAI Responses API (Codex CLI) and
the OpenAI Chat Completions API (aider): the first turn of a conversation asks the agent to
run one shell command (the edit), every later turn ends the conversation. Every request is
logged with its path and headers so tests can check what the agent sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ModelServer:
    """Serve on 127.0.0.1 (an ephemeral port) until `stop`."""

    def __init__(self, command: str, *, whole_file: tuple[str, str] | None = None) -> None:
        self.command = command  # the shell command the agent is asked to run
        self.whole_file = whole_file  # (path, content) for chat agents that edit files
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                server._log(self, None)
                body = b'{"data": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                server._log(self, body)
                path = self.path.split("?")[0]
                if path.endswith("/messages/count_tokens"):
                    return self._json({"input_tokens": 10})
                if path.endswith("/messages"):
                    return self._sse(server._anthropic(body))
                if path.endswith("/responses"):
                    return self._sse(server._responses(body))
                if path.endswith("/chat/completions"):
                    if body.get("stream"):
                        return self._sse(server._chat_stream(body))
                    return self._json(server._chat(body))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _json(self, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _sse(self, events: Iterator[tuple[str | None, dict[str, Any] | str]]) -> None:
                chunks = []
                for name, data in events:
                    text = data if isinstance(data, str) else json.dumps(data)
                    chunks.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
                raw = "".join(chunks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _log(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self._lock:
            self.requests.append({"method": handler.command, "path": handler.path,
                                  "headers": dict(handler.headers), "body": body})  # fmt: skip

    # --- Anthropic Messages (Claude Code) -------------------------------------------------

    def _anthropic(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        messages = body.get("messages") or []
        answered = any(
            isinstance(part, dict) and part.get("type") == "tool_result"
            for m in messages if isinstance(m.get("content"), list) for part in m["content"]
        )  # fmt: skip
        model = body.get("model", "scripted")
        yield "message_start", {"type": "message_start", "message": {
            "id": "msg_scripted", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}  # fmt: skip
        if answered or not body.get("tools"):
            yield "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}  # fmt: skip
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": "Done."}}  # fmt: skip
            stop = "end_turn"
        else:
            yield "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "tool_use", "id": "toolu_1",
                                                            "name": "Bash", "input": {}}}  # fmt: skip
            args = json.dumps({"command": self.command, "description": "apply the edit"})
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "input_json_delta",
                                                    "partial_json": args}}  # fmt: skip
            stop = "tool_use"
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": 20}}  # fmt: skip
        yield "message_stop", {"type": "message_stop"}

    # --- OpenAI Responses (Codex CLI) -----------------------------------------------------

    def _responses(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        items = body.get("input") or []
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output"
                       for i in items)  # fmt: skip
        response = {"id": "resp_scripted", "object": "response", "status": "in_progress",
                    "model": body.get("model", "scripted"), "output": []}  # fmt: skip
        yield "response.created", {"type": "response.created", "response": response}
        if answered:
            item: dict[str, Any] = {
                "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
            }  # fmt: skip
        else:
            item = {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                    "name": "exec_command", "status": "completed",
                    "arguments": json.dumps({"cmd": self.command})}  # fmt: skip
        yield "response.output_item.done", {"type": "response.output_item.done",
                                            "output_index": 0, "item": item}  # fmt: skip
        done = dict(response, status="completed", output=[item],
                    usage={"input_tokens": 10, "output_tokens": 20, "total_tokens": 30,
                           "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens_details": {"reasoning_tokens": 0}})  # fmt: skip
        yield "response.completed", {"type": "response.completed", "response": done}

    # --- OpenAI Chat Completions (aider) --------------------------------------------------

    def _chat_text(self, body: dict[str, Any]) -> str:
        if self.whole_file is None:
            return "Done."
        path, content = self.whole_file
        return f"{path}\n```\n{content}```\n"

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": 0,
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": self._chat_text(body)}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}}  # fmt: skip

    def _chat_stream(self, body: dict[str, Any]) -> Iterator[tuple[None, dict[str, Any] | str]]:
        base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0,
                "model": body.get("model", "scripted")}  # fmt: skip
        yield None, dict(base, choices=[{"index": 0, "delta": {"role": "assistant",
                                                               "content": self._chat_text(body)},
                                         "finish_reason": None}])  # fmt: skip
        yield None, dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
        yield None, "[DONE]"
