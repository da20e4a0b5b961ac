"""Asynchronous gRPC and HTTP clients for the load generator.

Each request of the workload is serialized once, before any is timed, and sent as often as the
schedule says; responses are checked for success but not decoded, so the client spends as little
CPU as it can (on a small machine it shares the cores with the server). gRPC goes through
``grpc.aio`` with Triton's generated stubs, HTTP through ``aiohttp`` with the KServe v2 binary
extension, both as tritonclient would send them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from tools.load.workload import Request

OK = "OK"


class Transport(Protocol):
    async def send(self, index: int, timeout_s: float) -> tuple[str, str]:
        """Send request ``index``; ("OK", "") or (status, error message)."""

    async def close(self) -> None: ...


class GrpcTransport:
    def __init__(self, url: str, model: str, version: str, requests: Sequence[Request], outputs: Sequence[str]):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._grpc, self._stub, self._url = grpc, service_pb2_grpc.GRPCInferenceServiceStub, url
        self._channel = self._infer = None  # made in the event loop that sends
        self._messages = []
        for request in requests:
            message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
            for name, array in request.inputs.items():
                tensor = message.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype))
                tensor.shape.extend(array.shape)
                message.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
            for name in outputs:
                message.outputs.add(name=name)
            self._messages.append(message)

    async def send(self, index: int, timeout_s: float) -> tuple[str, str]:
        if self._channel is None:
            self._channel = self._grpc.aio.insecure_channel(self._url, options=[
                ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
            self._infer = self._stub(self._channel).ModelInfer
        try:
            await self._infer(self._messages[index], timeout=timeout_s)
            return OK, ""
        except self._grpc.aio.AioRpcError as exc:
            return exc.code().name, exc.details() or ""

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


class HttpTransport:
    def __init__(self, url: str, model: str, version: str, requests: Sequence[Request], outputs: Sequence[str]):
        import aiohttp
        import tritonclient.http as httpclient

        self._aiohttp = aiohttp
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        self._url = f"http://{url}{path}"
        self._session: aiohttp.ClientSession | None = None
        self._bodies = []
        for request in requests:
            inputs = []
            for name, array in request.inputs.items():
                tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array, binary_data=True)
                inputs.append(tensor)
            wanted = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
            body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=wanted)
            headers = {"Inference-Header-Content-Length": str(json_size)} if json_size is not None else {}
            self._bodies.append((body, headers))

    async def send(self, index: int, timeout_s: float) -> tuple[str, str]:
        aiohttp = self._aiohttp
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body, headers = self._bodies[index]
        try:
            async with self._session.post(self._url, data=body, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                content = await response.read()
                if response.status == 200:
                    return OK, ""
                return f"HTTP_{response.status}", _http_error(content)
        except TimeoutError:
            return "DEADLINE_EXCEEDED", f"no response within {timeout_s:g} s"
        except aiohttp.ClientError as exc:
            return "UNAVAILABLE", str(exc)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _http_error(content: bytes) -> str:
    """Triton answers a failed HTTP request with ``{"error": "..."}``."""
    try:
        return str(json.loads(content).get("error", ""))
    except (ValueError, AttributeError):
        return content[:200].decode(errors="replace")


def make_transport(protocol: str, url: str, model: str, version: str, requests: Sequence[Request],
                   outputs: Sequence[str]) -> Transport:
    kinds = {"grpc": GrpcTransport, "http": HttpTransport}
    return kinds[protocol](url, model, version, requests, outputs)
