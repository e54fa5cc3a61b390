"""From PyTorch to diagram: `.pen` text for a module's computation, or for one einsum.

    >>> import penrose, torch
    >>> text = penrose.trace(torch.nn.Linear(4, 3), torch.randn(2, 4))
    >>> model = penrose.compile(text)
    >>> sorted(model.state_dict())
    ['bias', 'weight']

`trace` reads the module through `torch.export` (an ATen graph whose nodes know the submodule
that made them and the user's source line), writes one block per submodule call (params keep
their state-dict names, so `compile(text).load_state_dict(module.state_dict())` works), names
legs by the module's own shapes, checks the text and, by default, runs it against the module on
the example inputs. What the language cannot say is a `PenroseTraceError` naming the op and the
user's line. `einsum_text(spec)` is the diagram of one einsum (`penrose render --einsum`).
Importing this package imports no torch; `trace` does.
"""

from __future__ import annotations

from penrose.tracing.einsum import einsum_text
from penrose.tracing.errors import PenroseTraceError


def trace(module, *example_inputs, dims=None, verify=True, notes=False, batch=None, title=None) -> str:
    """The `.pen` text of `module`'s computation on inputs shaped like `example_inputs`.

    - `dims`: names for input axes, `{"b": 0, "t": 1}` (axes of the first input) or
      `{"t": (1, 0)}` (input 1, axis 0). Naming axis 0 declares the batch axis as a leg.
    - `batch`: None (default) reads axis 0 of the inputs as the batch every penrose input
      accepts, unless an op mixes it with other axes (then it becomes the leg `b`, still free);
      a module whose batch the diagram would have to fix (merged into one leg with others) is
      refused at that line, as is one whose batch is another axis (`nn.MultiheadAttention` with
      batch_first=False). False always declares it, and accepts a fixed batch (the header
      says so); True refuses a module that does not keep it apart.
    - `verify`: compile the text, load the module's state dict and compare outputs on the
      example inputs (eval mode); a mismatch is a `PenroseTraceError`.
    - `notes`: each statement keeps the user's source line as its note.

    The module is traced in eval mode (its mode is restored): dropout appears as `dropout`,
    active when the compiled model trains; code under `if self.training` follows the eval path.
    """
    from penrose.tracing.run import trace_module

    return trace_module(module, example_inputs, dims=dims, verify=verify, notes=notes, batch=batch, title=title)


__all__ = ["PenroseTraceError", "einsum_text", "trace"]
