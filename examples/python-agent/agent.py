"""A small AG-UI agent built on the official Python SDK (`ag-ui-protocol`), as a team would
write one: FastAPI takes the `RunAgentInput`, the SDK's `EventEncoder` writes the SSE frames.

It answers a currency question with a streamed text message, a backend tool call (streamed
arguments, then its result) and a `STATE_DELTA` recording the conversion. Deterministic (a
fixed rate table, no model), so the broker's tests can run it as a real producer nobody here
wrote the wire format of.

Run: python agent.py [--host 127.0.0.1] [--port 8091]; then POST a RunAgentInput to /.
"""

import argparse
import json
import re
from typing import AsyncIterator

import uvicorn
from ag_ui.core import (
    EventType,
    RunAgentInput,
    RunFinishedEvent,
    RunStartedEvent,
    StateDeltaEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

# Units of the quote currency per unit of the base currency.
RATES = {("EUR", "USD"): 1.084, ("USD", "EUR"): 0.9225, ("GBP", "EUR"): 1.1712}

app = FastAPI(title="ag-ui python example agent")


def last_user_text(input_data: RunAgentInput) -> str:
    """The content of the last user message, as text ("" when there is none)."""
    for message in reversed(input_data.messages):
        if message.role == "user":
            content = message.content
            if isinstance(content, str):
                return content
            return " ".join(getattr(part, "text", "") for part in content)
    return ""


def parse_question(text: str) -> tuple[float, str, str]:
    """`"100 EUR to USD"` → `(100.0, "EUR", "USD")`; defaults for what the text leaves out."""
    amount = re.search(r"\d+(?:\.\d+)?", text)
    codes = re.findall(r"\b(EUR|USD|GBP)\b", text.upper())
    if len(codes) == 1:
        codes.append("EUR" if codes[0] == "USD" else "USD")
    base, quote = (codes + ["EUR", "USD"])[:2]
    if (base, quote) not in RATES:
        base, quote = "EUR", "USD"
    return (float(amount.group()) if amount else 100.0), base, quote


def words(text: str) -> list[str]:
    """`text` cut after each space: the deltas of a streamed message."""
    return re.findall(r"\S+\s*", text)


async def run(input_data: RunAgentInput, encoder: EventEncoder) -> AsyncIterator[str]:
    """One run: RUN_STARTED … RUN_FINISHED, encoded by the SDK."""
    run_id = input_data.run_id
    amount, base, quote = parse_question(last_user_text(input_data))
    yield encoder.encode(
        RunStartedEvent(
            type=EventType.RUN_STARTED, thread_id=input_data.thread_id, run_id=run_id
        )
    )

    intro = f"{run_id}-intro"
    yield encoder.encode(
        TextMessageStartEvent(
            type=EventType.TEXT_MESSAGE_START, message_id=intro, role="assistant"
        )
    )
    for delta in words(f"Let me look up the {base}/{quote} rate."):
        yield encoder.encode(
            TextMessageContentEvent(
                type=EventType.TEXT_MESSAGE_CONTENT, message_id=intro, delta=delta
            )
        )
    yield encoder.encode(
        TextMessageEndEvent(type=EventType.TEXT_MESSAGE_END, message_id=intro)
    )

    call = f"{run_id}-call"
    yield encoder.encode(
        ToolCallStartEvent(
            type=EventType.TOOL_CALL_START,
            tool_call_id=call,
            tool_call_name="get_exchange_rate",
            parent_message_id=intro,
        )
    )
    args = json.dumps({"base": base, "quote": quote})
    for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
        yield encoder.encode(
            ToolCallArgsEvent(type=EventType.TOOL_CALL_ARGS, tool_call_id=call, delta=piece)
        )
    yield encoder.encode(ToolCallEndEvent(type=EventType.TOOL_CALL_END, tool_call_id=call))
    rate = RATES[(base, quote)]
    yield encoder.encode(
        ToolCallResultEvent(
            type=EventType.TOOL_CALL_RESULT,
            message_id=f"{run_id}-result",
            tool_call_id=call,
            content=json.dumps({"rate": rate}),
            role="tool",
        )
    )

    converted = round(amount * rate, 2)
    yield encoder.encode(
        StateDeltaEvent(
            type=EventType.STATE_DELTA,
            delta=[
                {
                    "op": "add",
                    "path": "/lastConversion",
                    "value": {
                        "amount": amount,
                        "from": base,
                        "to": quote,
                        "rate": rate,
                        "result": converted,
                    },
                }
            ],
        )
    )

    answer = f"{run_id}-answer"
    yield encoder.encode(
        TextMessageStartEvent(
            type=EventType.TEXT_MESSAGE_START, message_id=answer, role="assistant"
        )
    )
    for delta in words(f"{amount:g} {base} is {converted:.2f} {quote} at {rate}."):
        yield encoder.encode(
            TextMessageContentEvent(
                type=EventType.TEXT_MESSAGE_CONTENT, message_id=answer, delta=delta
            )
        )
    yield encoder.encode(
        TextMessageEndEvent(type=EventType.TEXT_MESSAGE_END, message_id=answer)
    )
    yield encoder.encode(
        RunFinishedEvent(
            type=EventType.RUN_FINISHED,
            thread_id=input_data.thread_id,
            run_id=run_id,
            result={"converted": converted},
        )
    )


@app.post("/")
async def agent(input_data: RunAgentInput, request: Request) -> StreamingResponse:
    """The AG-UI endpoint: a RunAgentInput in (FastAPI answers 422 to anything else), the
    run's events out as `text/event-stream`."""
    encoder = EventEncoder(accept=request.headers.get("accept"))
    return StreamingResponse(run(input_data, encoder), media_type=encoder.get_content_type())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    options = parser.parse_args()
    uvicorn.run(app, host=options.host, port=options.port, log_level="warning")
