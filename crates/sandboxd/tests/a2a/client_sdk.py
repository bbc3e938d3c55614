"""The official A2A Python SDK (a2a-sdk, pinned in .ci/run) against a real `sandboxd serve`.

Run by tests/serve_a2a.rs: argv = base URL, alice's key, bob's key. The scripted fake LLM
answers the runs in the order of the steps below, so the steps run one after another. Any
failed check raises; the last line printed is A2A-SDK-OK.
"""

import asyncio
import sys
import uuid

import httpx

from a2a.client import ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.compat.v0_3 import types as v03
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError

BASE, ALICE, BOB = sys.argv[1], sys.argv[2], sys.argv[3]
T = TaskState


def http(key):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(headers=headers, timeout=120)


async def client(key, streaming=False, polling=False):
    cfg = ClientConfig(streaming=streaming, polling=polling, httpx_client=http(key))
    return await create_client(BASE, client_config=cfg)


def message(text, task_id="", context_id=""):
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            task_id=task_id,
            context_id=context_id,
        )
    )


async def send(c, text, **kw):
    items = [r async for r in c.send_message(message(text, **kw))]
    assert len(items) == 1 and items[0].HasField("task"), items
    return items[0].task


def answer_of(task):
    texts = [p.text for a in task.artifacts if a.name == "answer" for p in a.parts]
    assert len(texts) == 1, task.artifacts
    return texts[0]


def files_of(task):
    return {p.filename: p.url for a in task.artifacts if a.name == "workspace" for p in a.parts}


def seq_of(update):
    return int(update.metadata["sandboxd"]["seq"])


async def raises(exc, coro):
    try:
        await coro
    except exc as e:
        return e
    raise AssertionError(f"expected {exc.__name__}")


async def card_and_auth():
    async with http(None) as h:
        card = (await h.get(f"{BASE}/.well-known/agent-card.json")).json()
        assert card["capabilities"]["streaming"] is True, card
        scheme = card["securitySchemes"]["sandboxd_api_key"]["httpAuthSecurityScheme"]
        assert scheme["scheme"].lower() == "bearer", card
        assert [s["id"] for s in card["skills"]] == ["agent", "plan"], card
        body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        r = await h.post(f"{BASE}/a2a", json=body, headers={"A2A-Version": "1.0"})
        assert r.status_code == 401, (r.status_code, r.text)
        r = await h.post(f"{BASE}/a2a", json=body,
                         headers={"A2A-Version": "1.0", "Authorization": "Bearer sk-wrong"})
        assert r.status_code == 401, (r.status_code, r.text)
    c = await client("sk-wrong")
    assert c._card.name == "sandboxd"
    await raises(A2AClientError, c.get_task(GetTaskRequest(id="x")))
    ext = await (await client(ALICE)).get_extended_agent_card(GetExtendedAgentCardRequest())
    assert ext.name == "sandboxd" and ext.capabilities.streaming


async def send_and_continue(alice):
    task = await send(alice, "Write hello-a2a to /workspace/report.txt")
    assert task.status.state == T.TASK_STATE_COMPLETED, task
    assert answer_of(task) == "ANSWER-ONE"
    url = files_of(task)["report.txt"]
    async with http(ALICE) as h:
        r = await h.get(url)
        assert r.status_code == 200 and r.text == "hello-a2a\n", (r.status_code, r.text)
    got = await alice.get_task(GetTaskRequest(id=task.id))
    assert got.status.state == T.TASK_STATE_COMPLETED and answer_of(got) == "ANSWER-ONE"
    again = await send(alice, "And again", context_id=task.context_id)
    assert again.context_id == task.context_id and again.id != task.id
    assert answer_of(again) == "ANSWER-AGAIN" and "report.txt" in files_of(again)
    return task


async def streaming():
    alice = await client(ALICE, streaming=True)
    items = [r async for r in alice.send_message(message("Stream it"))]
    kinds = [r.WhichOneof("payload") for r in items]
    assert kinds[0] == "task" and items[0].task.status.state == T.TASK_STATE_SUBMITTED, items[0]
    assert kinds[-1] == "status_update", kinds
    assert items[-1].status_update.status.state == T.TASK_STATE_COMPLETED
    first_artifact = kinds.index("artifact_update")
    assert all(k == "status_update" for k in kinds[1:first_artifact]), kinds
    assert all(k == "artifact_update" for k in kinds[first_artifact:-1]), kinds
    states = [i.status_update.status.state for i in items if i.HasField("status_update")]
    assert states[0] == T.TASK_STATE_WORKING and states.count(T.TASK_STATE_COMPLETED) == 1, states
    said = [p.text for i in items if i.HasField("status_update")
            for p in i.status_update.status.message.parts]
    assert "STREAM-THINKING" in said, said
    arts = [i.artifact_update.artifact for i in items if i.HasField("artifact_update")]
    assert [p.text for a in arts if a.name == "answer" for p in a.parts] == ["ANSWER-TWO"]
    seqs = [seq_of(i.status_update) for i in items if i.HasField("status_update")]
    assert seqs == sorted(set(seqs)), seqs


async def ask_human(alice):
    task = await send(alice, "Paint the fence")
    assert task.status.state == T.TASK_STATE_INPUT_REQUIRED, task
    assert task.status.message.parts[0].text == "Which color?", task.status
    done = await send(alice, "blue", task_id=task.id, context_id=task.context_id)
    assert done.id == task.id and done.status.state == T.TASK_STATE_COMPLETED, done
    assert answer_of(done) == "ANSWER-BLUE"


async def resubscribe():
    alice = await client(ALICE, streaming=True)
    seen, task_id = [], None
    async for r in alice.send_message(message("Take your time")):
        if r.HasField("task"):
            task_id = r.task.id
        if r.HasField("status_update"):
            seen.append(seq_of(r.status_update))
            if any(p.text == "STEP-ONE" for p in r.status_update.status.message.parts):
                break  # the client goes away mid-run
    assert task_id and seen, seen
    items = [r async for r in alice.subscribe(SubscribeToTaskRequest(id=task_id))]
    assert items[0].HasField("task"), items[0]
    snap = items[0].task
    assert snap.status.state == T.TASK_STATE_WORKING, snap.status
    last = int(snap.metadata["sandboxd"]["lastSeq"])
    assert last >= seen[-1], (last, seen)
    after = [seq_of(i.status_update) for i in items[1:] if i.HasField("status_update")]
    assert after and after[0] > last and after == sorted(set(after)), (last, after)
    assert not set(after) & set(seen), (seen, after)
    arts = [i.artifact_update.artifact for i in items if i.HasField("artifact_update")]
    assert [p.text for a in arts if a.name == "answer" for p in a.parts] == ["ANSWER-RESUB"]
    assert items[-1].status_update.status.state == T.TASK_STATE_COMPLETED


async def version_03(context_id):
    msg = {"kind": "message", "messageId": str(uuid.uuid4()), "role": "user",
           "contextId": context_id, "parts": [{"kind": "text", "text": "Old client"}]}
    async with http(ALICE) as h:
        async def rpc(method, params, headers=None):
            body = {"jsonrpc": "2.0", "id": "r1", "method": method, "params": params}
            r = await h.post(f"{BASE}/a2a", json=body, headers=headers or {})
            assert r.status_code == 200, r.text
            assert method != "message/send" or "result" in r.json(), r.text
            return r.json()
        sent = v03.SendMessageSuccessResponse.model_validate(
            await rpc("message/send", {"message": msg}))
        task = sent.result
        assert isinstance(task, v03.Task) and task.status.state == v03.TaskState.completed, task
        assert task.artifacts[0].parts[0].root.text == "ANSWER-OLD", task.artifacts
        got = await rpc("tasks/get", {"id": task.id})
        assert v03.Task.model_validate(got["result"]).id == task.id
        err = await rpc("tasks/cancel", {"id": task.id})
        assert err["error"]["code"] == -32002, err
        err = await rpc("GetTask", {"id": task.id})
        assert err["error"]["code"] == -32601, err
        err = await rpc("GetTask", {"id": task.id}, {"A2A-Version": "7.0"})
        assert err["error"]["code"] == -32009, err


async def isolation(alice, task):
    bob = await client(BOB)
    await raises(TaskNotFoundError, bob.get_task(GetTaskRequest(id=task.id)))
    await raises(TaskNotFoundError, bob.cancel_task(CancelTaskRequest(id=task.id)))
    bob_s = await client(BOB, streaming=True)
    await raises(TaskNotFoundError, anext(bob_s.subscribe(SubscribeToTaskRequest(id=task.id))))
    assert len((await bob.list_tasks(ListTasksRequest())).tasks) == 0
    e = await raises(InvalidParamsError, send(bob, "hijack", context_id=task.context_id))
    assert "not found" in str(e), e
    mine = await alice.list_tasks(ListTasksRequest(context_id=task.context_id))
    # The first task, its continuation and the 0.3 client's task share the context.
    assert {t.context_id for t in mine.tasks} == {task.context_id} and len(mine.tasks) == 3, mine
    everything = await alice.list_tasks(ListTasksRequest())
    assert len(everything.tasks) == 6, [t.id for t in everything.tasks]


async def main():
    await card_and_auth()
    alice = await client(ALICE)
    first = await send_and_continue(alice)
    await streaming()
    await ask_human(alice)
    await resubscribe()
    await version_03(first.context_id)
    await isolation(alice, first)
    polling = await client(ALICE, polling=True)
    task = await send(polling, "Wait for the slow model", context_id=first.context_id)
    assert task.status.state in (T.TASK_STATE_SUBMITTED, T.TASK_STATE_WORKING), task.status
    canceled = await alice.cancel_task(CancelTaskRequest(id=task.id))
    assert canceled.status.state == T.TASK_STATE_CANCELED, canceled.status
    await raises(TaskNotCancelableError, alice.cancel_task(CancelTaskRequest(id=task.id)))
    print("A2A-SDK-OK")


asyncio.run(main())
