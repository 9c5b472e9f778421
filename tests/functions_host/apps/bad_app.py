"""Functions the local host must refuse at start, each for a different reason."""

from __future__ import annotations

import azure.functions as func

app = func.FunctionApp()


@app.timer_trigger(arg_name="timer", schedule="0 */5 * * * *")
def every_five_minutes(timer: func.TimerRequest) -> None:
    pass


@app.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="q")
@app.blob_output(arg_name="blob", path="out/{rand-guid}", connection="Storage")
def with_blob(msg: func.ServiceBusMessage, blob: func.Out[str]) -> None:
    pass


@app.service_bus_queue_trigger(arg_name="msg", connection="Missing", queue_name="%NoSuch%")
def unresolved(msg: func.ServiceBusMessage) -> None:
    pass


@app.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="q")
def wrong_params(message: func.ServiceBusMessage) -> None:
    pass


@app.service_bus_queue_trigger(arg_name="msg", connection="FhServiceBus", queue_name="q")
def fine(msg: func.ServiceBusMessage) -> None:
    pass
