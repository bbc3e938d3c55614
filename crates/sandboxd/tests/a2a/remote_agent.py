"""A remote A2A agent built with the official a2a-sdk's server (1.3.0) and uvicorn, for the
test of sandboxd's `remote_agents` tool (tests/agent_remote_a2a.rs).

Usage: remote_agent.py TOKEN

It prints `PORT <n>` once it listens on 127.0.0.1 and then serves until killed. Every JSON-RPC
call must carry `Authorization: Bearer TOKEN` (else 401). What it does with a message:
- "ask ..."  -> the task asks a question (input-required: "Which city?"); the next message in
  that task answers it and the task completes with "weather in <answer>: sunny".
- "slow ..." -> the task stays working for 2 s before it completes (the client must poll).
- anything else -> a completed task whose artifact is "echo: <text> [context <contextId>]".
Each request's Authorization header is checked, never printed.
"""

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.request_handlers.default_request_handler_v2 import DefaultRequestHandlerV2
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, TaskState

TOKEN = sys.argv[1]


async def bearer(request, call_next):
    if request.url.path == "/rpc" and request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    return await call_next(request)


class Weather(AgentExecutor):
    async def execute(self, context, event_queue):
        text = get_message_text(context.message)
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        asking = task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        if asking:
            answer = f"weather in {text}: sunny"
        elif text.startswith("ask"):
            question = updater.new_agent_message([new_text_part("Which city?")])
            await updater.requires_input(question)
            return
        elif text.startswith("slow"):
            await updater.start_work()
            await asyncio.sleep(2)
            answer = f"slow echo: {text}"
        else:
            answer = f"echo: {text} [context {task.context_id}]"
        await updater.add_artifact([new_text_part(answer)], name="answer")
        await updater.complete()

    async def cancel(self, context, event_queue):
        pass


def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/rpc"
    card = AgentCard(
        name="weather",
        description="Answers questions about the weather (a test agent).",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="weather",
                name="Weather",
                description="The weather in a city",
                tags=["weather"],
            )
        ],
    )
    handler = DefaultRequestHandlerV2(
        agent_executor=Weather(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/rpc")
    app = Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=bearer)])

    print(f"PORT {port}", flush=True)
    config = uvicorn.Config(app, log_level="warning")
    server = uvicorn.Server(config)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
