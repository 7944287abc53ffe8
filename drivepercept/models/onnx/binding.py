"""An ONNX Runtime session run on torch tensors where they are, through IO binding.

The image input is bound to the engine's device tensor (its pointer, shape and element type)
and each output to a torch tensor allocated on that device when its shape is known from the
graph and the batch size, else to ORT's own allocation, taken over through DLPack. On a GPU no
byte crosses host memory, and ORT returns without waiting for the device: its kernels run on
the stream the session was made with, and a batch that comes on another stream is ordered
with it by waits between the two streams, not by a host wait.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from drivepercept.models.onnx.layouts import Graph, Port

# ORT's tensor types -> (torch dtype, numpy dtype for ORT's element_type)
DTYPES: dict[str, tuple[torch.dtype, type[np.generic]]] = {
    "tensor(float)": (torch.float32, np.float32),
    "tensor(float16)": (torch.float16, np.float16),
    "tensor(double)": (torch.float64, np.float64),
    "tensor(int64)": (torch.int64, np.int64),
    "tensor(int32)": (torch.int32, np.int32),
    "tensor(uint8)": (torch.uint8, np.uint8),
    "tensor(bool)": (torch.bool, np.bool_),
}


class DeviceRun:
    """A session run on one device's tensors through IO binding.

    Args:
        session: the `InferenceSession` (its providers fit the device).
        graph: its ports.
        device: the device the batches are on (and outputs are made on).
        stream: the CUDA stream handle the session runs on (`user_compute_stream`), None on
            the CPU or for the session's own stream.
        loop: run a batch as one session run per image (a batch-1 export).
    """

    def __init__(
        self,
        session: Any,
        graph: Graph,
        device: torch.device,
        *,
        stream: int | None = None,
        loop: bool = False,
    ) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]

        self.session = session
        self.graph = graph
        self.device = device
        self.stream = stream
        self.loop = loop
        self.device_type = "cuda" if device.type == "cuda" else "cpu"
        self.device_id = (device.index or 0) if device.type == "cuda" else 0
        self.options = ort.RunOptions()
        if self.device_type == "cuda":
            # return once launched: the stream orders everything after it
            self.options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self.runs = 0  # session runs made through the binding
        self._sizes: dict[tuple[int, int, int], torch.Tensor] = {}

    def __call__(self, x: torch.Tensor, hw: tuple[int, int]) -> list[torch.Tensor]:
        """The graph's outputs for a (B, 3, H, W) batch on `device`, as tensors there."""
        image = self.graph.image
        x = x.to(DTYPES.get(image.type, DTYPES["tensor(float)"])[0]).contiguous()
        theirs = self._their_stream(x)
        if theirs is not None:  # ORT's stream waits for the batch, ours for ORT's outputs
            theirs.wait_stream(torch.cuda.current_stream(x.device))
        if self.loop and x.shape[0] > 1:
            runs = [self._once(x[i : i + 1], hw) for i in range(x.shape[0])]
        else:
            runs = [self._once(x, hw)]
        if theirs is not None:  # before anything on our stream reads the outputs
            torch.cuda.current_stream(x.device).wait_stream(theirs)
        if len(runs) == 1:
            return runs[0]
        return [torch.cat(parts) for parts in zip(*runs, strict=True)]

    def _their_stream(self, x: torch.Tensor) -> torch.cuda.ExternalStream | None:
        if self.stream is None or x.device.type != "cuda":
            return None
        if torch.cuda.current_stream(x.device).cuda_stream == self.stream:
            return None
        return torch.cuda.ExternalStream(self.stream, device=x.device)  # type: ignore[no-untyped-call]

    def _once(self, x: torch.Tensor, hw: tuple[int, int]) -> list[torch.Tensor]:
        b = int(x.shape[0])
        binding = self.session.io_binding()
        self._bind_input(binding, self.graph.image, x)
        size_port = self.graph.size_input
        if size_port is not None:
            # (width, height) of the model input: boxes come back in model-input pixels
            self._bind_input(binding, size_port, self._size_tensor(size_port, b, hw))
        made: list[torch.Tensor | None] = []
        for port in self.graph.outputs:
            out = self._output_tensor(port, b)
            if out is None:
                binding.bind_output(port.name, self.device_type, self.device_id)
            else:
                kind = DTYPES[port.type][1]
                shape = tuple(out.shape)
                binding.bind_output(
                    port.name, self.device_type, self.device_id, kind, shape, out.data_ptr()
                )
            made.append(out)
        self.session.run_with_iobinding(binding, self.options)
        self.runs += 1
        if all(t is not None for t in made):
            return [t for t in made if t is not None]
        ort_values = binding.get_outputs()
        return [
            t if t is not None else self._adopt(v) for t, v in zip(made, ort_values, strict=True)
        ]

    def _bind_input(self, binding: Any, port: Port, t: torch.Tensor) -> None:
        kind = DTYPES.get(port.type, DTYPES["tensor(float)"])[1]
        binding.bind_input(
            port.name, self.device_type, self.device_id, kind, tuple(t.shape), t.data_ptr()
        )

    def _size_tensor(self, port: Port, b: int, hw: tuple[int, int]) -> torch.Tensor:
        key = (b, hw[0], hw[1])
        if key not in self._sizes:
            dtype = DTYPES.get(port.type, DTYPES["tensor(int64)"])[0]
            row = torch.tensor([[hw[1], hw[0]]], dtype=dtype)
            self._sizes[key] = row.repeat(b, 1).to(self.device)
        return self._sizes[key]

    def _output_tensor(self, port: Port, b: int) -> torch.Tensor | None:
        """A tensor for an output whose shape the graph fixes (batch aside), else None."""
        rest = port.shape[1:]
        if port.type not in DTYPES or not port.shape or any(d is None for d in rest):
            return None
        shape = (b, *(int(d) for d in rest if d is not None))
        return torch.empty(shape, dtype=DTYPES[port.type][0], device=self.device)

    def _adopt(self, value: Any) -> torch.Tensor:
        """An ORT-allocated output as a torch tensor on the device, without a copy where
        this onnxruntime speaks DLPack (1.17 and later), else through host memory."""
        if hasattr(value, "__dlpack__"):
            return torch.utils.dlpack.from_dlpack(value)
        c_value = value._get_c_value() if hasattr(value, "_get_c_value") else value
        if hasattr(c_value, "to_dlpack"):
            return torch.utils.dlpack.from_dlpack(c_value.to_dlpack())
        return torch.from_numpy(np.ascontiguousarray(value.numpy())).to(self.device)
