"""Every user mistake is a PenroseError subclass with its message, line and column.

The checker rules are those listed in penrose/checker.py's docstring (names, legs, sizes, dtypes,
usage), then the syntax errors the parser reports, then the run-time input checks.
"""

from __future__ import annotations

import importlib
import re

import pytest
import torch

import penrose
from penrose.errors import (
    PenroseCheckError,
    PenroseCompileError,
    PenroseError,
    PenroseShapeError,
    PenroseSyntaxError,
    Span,
)

check_module = importlib.import_module("penrose.checker")  # `penrose.check` is also the function

B = "dim t = 2, e = 3, f = 4, f2 = 8\ninput x[t, e]\n"  # lines 1-2 of most cases
BLK = "block f1(x[t, e]) {\n  param W[e, f]\n  return einsum('te,ef->tf', x, W)\n}\n"  # 4 lines

# (id, text, error class, message regex, line, column)
CASES = [
    # -- names
    ("undefined name, near miss", "dim t = 2, e = 3, d = 2\ninput Z[t, e]\nparam W_q[e, d]\nq = einsum('te,ed->td', Z, W_k)\noutput q",
     PenroseCheckError, r"unknown tensor 'W_k'; did you mean 'W_q'\?", 4, 28),
    ("unknown output", B + "output y", PenroseCheckError, r"unknown tensor 'y'", 3, 1),
    ("a dim is not a tensor", B + "output e", PenroseCheckError, r"unknown tensor 'e'; 'e' is a dim \(a leg\), not a tensor", 3, 1),
    ("unknown function, near miss", B + "y = sigmod(x)\noutput y", PenroseCheckError, r"unknown function 'sigmod'; did you mean 'sigmoid'\?", 3, 5),
    ("calling a tensor", B + "y = (x)(x)\noutput y", PenroseCheckError, r"'x' is a tensor, not a function", 3, 5),
    ("python keyword (tensor)", "dim t = 2\ninput lambda[t]\noutput lambda", PenroseCheckError, r"input name 'lambda' is a Python keyword", 2, 1),
    ("python keyword (dim)", "dim class = 2\ninput x[class]\noutput x", PenroseCheckError, r"dim name 'class' is a Python keyword", 1, 5),
    ("python soft keyword", "dim t = 2\ninput match[t]\noutput match", PenroseCheckError, r"'match' is a Python keyword", 2, 1),
    ("reserved by the generated module", "dim t = 2\ninput torch[t]\noutput torch", PenroseCheckError, r"'torch' is reserved by the generated module", 2, 1),
    ("reserved: self", "dim t = 2\ninput self[t]\noutput self", PenroseCheckError, r"'self' is reserved", 2, 1),
    ("leading underscore", "dim t = 2\ninput _x[t]\noutput _x", PenroseCheckError, r"invalid input name '_x': names start with a letter", 2, 1),
    ("nn.Module attribute: param", B + "param training[e]\ny = x * training\noutput y", PenroseCheckError,
     r"param name 'training' clashes with torch.nn.Module.training", 3, 1),
    ("nn.Module attribute: buffer", B + "buffer forward[e]\ny = x * forward\noutput y", PenroseCheckError,
     r"buffer name 'forward' clashes with torch.nn.Module.forward", 3, 1),
    ("nn.Module attribute: instance", B + BLK + "y = f1(x) as parameters\noutput y", PenroseCheckError,
     r"instance name 'parameters' clashes with torch.nn.Module.parameters", 7, 5),
    (".pen keyword", B + "repeat = x\noutput repeat", PenroseCheckError, r"tensor name 'repeat' is a .pen keyword", 3, 1),
    ("tensor named as a function", B + "input softmax[t]\noutput x", PenroseCheckError, r"tensor name 'softmax' is already a function", 3, 1),
    ("assign to a function name", B + "relu = x * 2\noutput relu", PenroseCheckError, r"'relu' is a function name", 3, 1),
    ("block named as a function", "block sum(x[t]) {\n  return x\n}\ndim t = 2\ninput z[t]\noutput z", PenroseCheckError,
     r"block name 'sum' is a built-in function", 1, 1),
    ("duplicate dim", "dim t = 2\ndim t = 3\ninput Z[t]\noutput Z", PenroseCheckError, r"dim 't' is declared twice", 2, 5),
    ("duplicate tensor", "dim t = 2\ninput Z[t]\nparam Z[t]\noutput Z", PenroseCheckError, r"'Z' is declared twice", 3, 1),
    ("declaration after use", B + "y = x * 2\ninput y[t]\noutput y", PenroseCheckError, r"'y' is already a computed tensor", 4, 1),
    ("duplicate block", "dim t = 2\nblock f(x[t]) {\n  return x\n}\nblock f(x[t]) {\n  return x\n}\ninput Z[t]\noutput Z",
     PenroseCheckError, r"block 'f' is defined twice", 5, 1),
    ("instance reused for another block", "dim t = 2\nblock f(x[t]) {\n  param W[t]\n  return x * W\n}\nblock g(x[t]) {\n  return x\n}\n"
     "input Z[t]\na = f(Z) as inst\nb = g(a) as inst\noutput b", PenroseCheckError, r"instance 'inst' is already a 'f' block", 11, 5),
    ("instance named as a tensor", B + BLK + "y = f1(x) as x\noutput y", PenroseCheckError, r"instance name 'x' is already a tensor", 7, 5),
    ("output twice", B + "output x, x", PenroseCheckError, r"'x' is output twice", 3, 1),
    ("assign to a param", B + "param W[e]\nW = x * 2\noutput W", PenroseCheckError, r"cannot assign to param 'W'", 4, 1),
    # -- outputs, blocks, statements
    ("missing output", B + "y = x * 2", PenroseCheckError, r"the diagram has no output; add 'output NAME'", 3, 1),
    ("empty diagram", "", PenroseCheckError, r"the diagram has no output", 1, 1),
    ("block never returns", "dim t = 2\nblock f(x[t]) {\n  y = x\n}\ninput Z[t]\ny = f(Z)\noutput y", PenroseCheckError,
     r"block 'f' never returns a value", 2, 1),
    ("block returns twice", "dim t = 2\nblock f(x[t]) {\n  return x\n  return x\n}\ninput Z[t]\ny = f(Z)\noutput y", PenroseCheckError,
     r"a block returns once", 4, 3),
    ("block recursion", "dim t = 2\nblock f(x[t]) {\n  return g(x)\n}\nblock g(x[t]) {\n  return f(x)\n}\ninput Z[t]\ny = f(Z)\noutput y",
     PenroseCheckError, r"recursion between blocks: f -> g -> f", 6, 10),
    ("block calls itself", "dim t = 2\nblock f(x[t]) {\n  return f(x)\n}\ninput Z[t]\ny = f(Z)\noutput y", PenroseCheckError,
     r"recursion between blocks: f -> f", 3, 10),
    ("block inside a block", "dim t = 2\nblock g(x[t]) {\n  block h(y[t]) {\n    return y\n  }\n  return x\n}\ninput z[t]\noutput z",
     PenroseCheckError, r"blocks are defined at the top level", 3, 3),
    ("input inside a block", B + "block g(a[t, e]) {\n  input z[t]\n  return a\n}\ny = g(x)\noutput y", PenroseCheckError,
     r"a block takes its inputs as arguments", 4, 3),
    ("output inside a block", B + "block g(a[t, e]) {\n  output a\n}\ny = g(x)\noutput y", PenroseCheckError,
     r"a block ends with 'return', not 'output'", 4, 3),
    ("return at the top level", B + "return x", PenroseCheckError, r"'return' is only for blocks", 3, 1),
    ("block argument count", B + BLK + "y = f1(x, x)\noutput y", PenroseCheckError, r"block 'f1' takes 1 argument\(s\), got 2", 7, 5),
    ("block argument legs", B + BLK + "input z[t]\ny = f1(z)\noutput y", PenroseCheckError,
     r"block 'f1': argument 'x' has legs \[t, e\] but 'z' has \[t\]", 8, 8),
    ("repeat needs matching legs", B + BLK + "y = f1(x) repeat 2\noutput y", PenroseCheckError,
     r"'repeat' feeds block 'f1''s result \[t, f\] back into its argument \[t, e\]", 7, 5),
    ("repeat on a non-block", B + "y = x * 2 repeat 2\noutput y", PenroseCheckError, r"'repeat N' applies to a statement that is one block call", 3, 1),
    ("as on a non-block", B + "y = x * 2 as foo\noutput y", PenroseCheckError, r"'as NAME' names the one block call", 3, 1),
    ("targets and values", B + "a, b = x * 2\noutput a", PenroseCheckError, r"2 target\(s\) but the value yields 1 tensor\(s\)", 3, 1),
    # -- init specs
    ("unknown init", B + "param W[e] ~ gaussian(std=1)\noutput x", PenroseCheckError,
     r"unknown init 'gaussian'; one of normal, zeros, ones, constant, uniform, xavier, fan_in, eye, causal, arange, rotary, rotary_cos, "
     r"rotary_sin", 3, 14),
    ("init near miss", B + "param W[e] ~ zero\noutput x", PenroseCheckError, r"unknown init 'zero'; did you mean 'zeros'\?", 3, 14),
    ("init keyword", B + "param W[e] ~ normal(sd=1)\noutput x", PenroseCheckError, r"normal\(\) takes mean, std, not 'sd'", 3, 24),
    ("init value", B + "param W[e] ~ normal(std=x)\noutput x", PenroseCheckError, r"init argument 'std' must be a number", 3, 25),
    ("eye needs two legs", B + "param W[e, e, e] ~ eye\noutput x", PenroseCheckError, r"eye initialises a tensor with two legs", 3, 20),
    # -- legs
    # an undeclared dim points at the leg itself, wherever a leg name is written
    ("undeclared dim", "dim t = 2\ninput Z[t, emb]\noutput Z", PenroseCheckError,
     r"undeclared dim 'emb' in input 'Z'; declare it with 'dim emb = SIZE'", 2, 12),
    ("undeclared dim, near miss", "dim t = 2, emb = 3\ninput Z[t, emd]\noutput Z", PenroseCheckError,
     r"undeclared dim 'emd' in input 'Z'; did you mean 'emb'\?", 2, 12),
    ("undeclared dim, first leg", "dim t = 2\ninput x[zz, t]\noutput x", PenroseCheckError,
     r"undeclared dim 'zz' in input 'x'", 2, 9),
    ("undeclared dim after '...'", "dim t = 2\ninput x[..., t, zz]\noutput x", PenroseCheckError,
     r"undeclared dim 'zz' in input 'x'", 2, 17),
    ("undeclared dim of an int input", "dim t = 2\ninput ids[t, zz] : int\noutput ids", PenroseCheckError,
     r"undeclared dim 'zz' in input 'ids'", 2, 14),
    ("undeclared dim in a param", B + "param W[e, qq]\noutput x", PenroseCheckError,
     r"undeclared dim 'qq' in param 'W'; declare it with 'dim qq = SIZE'", 3, 12),
    ("undeclared dim in a param, near miss", B + "param W[e, ff]\noutput x", PenroseCheckError,
     r"undeclared dim 'ff' in param 'W'; did you mean 'f'\?", 3, 12),
    ("undeclared dim in a buffer", B + "buffer P[t, qq] ~ zeros\noutput x", PenroseCheckError,
     r"undeclared dim 'qq' in buffer 'P'", 3, 13),
    ("undeclared dim on a continued line", B + "param W[e,\n        qq]\noutput x", PenroseCheckError,
     r"undeclared dim 'qq' in param 'W'", 4, 9),
    ("undeclared dim in split", B + "a, b = split(x, e, [f, qq])\noutput a", PenroseCheckError,
     r"split: undeclared dim 'qq'", 3, 24),
    ("undeclared dim in split, near miss", B + "a, b = split(x, e, [ff, f])\noutput a", PenroseCheckError,
     r"split: undeclared dim 'ff'; did you mean 'f'\?", 3, 21),
    ("undeclared dim in unflatten", "dim t = 2, e = 4, g = 2, r = 2\ninput q[t, e]\ny = unflatten(q, e, [g, r, qq])\noutput y",
     PenroseCheckError, r"unflatten: undeclared dim 'qq'", 3, 28),
    ("undeclared dim in a block argument", "dim t = 2, e = 3\nblock f(h[t, qq]) {\n  return h\n}\ninput x[t, e]\ny = f(x)\noutput y",
     PenroseCheckError, r"undeclared dim 'qq' in argument 'h'; declare it with 'dim qq = SIZE'", 2, 14),
    ("undeclared dim in a second block argument", "dim t = 2, e = 3\nblock f(a[t], h[t, ee]) {\n  return h\n}\ninput x[t, e]\n"
     "y = f(x, x)\noutput y", PenroseCheckError, r"undeclared dim 'ee' in argument 'h'; did you mean 'e'\?", 2, 20),
    ("undeclared dim in a block param", "dim t = 2, e = 3\nblock f(h[t, e]) {\n  param W[e, qq]\n  return h\n}\ninput x[t, e]\n"
     "y = f(x)\noutput y", PenroseCheckError, r"undeclared dim 'qq' in param 'W'", 3, 14),
    # a wrong leg name in a leg argument points at that name too
    ("wrong leg in softmax", B + "y = softmax(x, ee)\noutput y", PenroseCheckError,
     r"softmax: the tensor has no leg 'ee'; did you mean 'e'\?; its legs are \[t, e\]", 3, 16),
    ("wrong leg in split", B + "a, b = split(x, qq, [f, f])\noutput a", PenroseCheckError, r"split: the tensor has no leg 'qq'", 3, 17),
    ("wrong leg in unflatten", B + "y = unflatten(x, qq, [e, t])\noutput y", PenroseCheckError,
     r"unflatten: the tensor has no leg 'qq'", 3, 18),
    ("wrong leg in flatten", B + "y = flatten(x, [t, qq], f2)\noutput y", PenroseCheckError, r"flatten: the tensor has no leg 'qq'", 3, 20),
    ("wrong leg in concat", B + "y = concat([x, x], qq, f)\noutput y", PenroseCheckError, r"concat: the tensor has no leg 'qq'", 3, 20),
    ("undeclared joined leg in concat", B + "y = concat([x, x], e, qq)\noutput y", PenroseCheckError,
     r"concat: the third argument is the dim of the joined leg", 3, 23),
    ("undeclared joined leg in flatten", B + "y = flatten(x, [t, e], qq)\noutput y", PenroseCheckError,
     r"flatten: the third argument is the dim of the joined leg", 3, 24),
    ("wrong leg in rope", B + "y = rope(x, t, qq)\noutput y", PenroseCheckError, r"rope: the tensor has no leg 'qq'", 3, 16),
    ("undeclared dim in causal", B + "m = causal(t, qq)\ny = where(m, x, 0)\noutput y", PenroseCheckError,
     r"causal takes two dims", 3, 15),
    ("einsum term leg count", B + "y = einsum('tef->t', x)\noutput y", PenroseCheckError,
     r"einsum term 1 'tef' has 3 leg\(s\) but operand 1 'x' has 2: \[t, e\]", 3, 13),
    ("einsum spaced term leg count", B + "y = einsum('tok emb hid -> tok', x)\noutput y", PenroseCheckError,
     r"einsum term 1 'tok emb hid' has 3 leg\(s\) but operand 1 'x' has 2", 3, 13),
    ("einsum output leg in no input", B + "y = einsum('te->tx', x)\noutput y", PenroseCheckError,
     r"output leg 'x' appears in no input of the einsum", 3, 18),
    ("einsum operand count", B + "y = einsum('te,te->t', x)\noutput y", PenroseCheckError,
     r"the einsum spec has 2 input term\(s\) but 1 operand\(s\) follow it", 3, 15),
    ("einsum second '...' in a term", B + "y = einsum('t...e...->t', x)\noutput y", PenroseCheckError, r"a second '\.\.\.'", 3, 18),
    ("einsum two arrows", B + "y = einsum('te->t->e', x)\noutput y", PenroseCheckError, r"at most one '->'", 3, 18),
    ("einsum bad leg", B + "y = einsum('t1->t', x)\noutput y", PenroseCheckError, r"invalid leg '1' in the einsum spec", 3, 14),
    ("einsum repeated output leg", B + "y = einsum('te->tt', x)\noutput y", PenroseCheckError, r"output leg 't' appears twice", 3, 18),
    ("einsum without a spec", B + "y = einsum(x, x)\noutput y", PenroseCheckError, r"einsum's first argument is its spec string", 3, 5),
    ("einsum of a number", B + "y = einsum('te,->t', x, 2)\noutput y", PenroseCheckError, r"einsum operand 2 is a plain number", 3, 25),
    ("leg argument missing", "dim t = 2, p = 2\ninput x[t, p]\ny = softmax(x, q)\noutput y", PenroseCheckError,
     r"softmax: the tensor has no leg 'q'; its legs are \[t, p\]", 3, 16),
    ("leg argument needed", B + "y = softmax(x)\noutput y", PenroseCheckError, r"softmax needs the leg to act on", 3, 5),
    ("leg argument out of range", B + "y = softmax(x, dim=2)\noutput y", PenroseCheckError, r"softmax: dim=2 is out of range", 3, 20),
    ("unknown keyword", B + "y = softmax(x, e, foo=1)\noutput y", PenroseCheckError, r"softmax takes dim, not 'foo'", 3, 23),
    ("cannot broadcast", "dim t = 2, e = 3, d = 4\ninput a[t, e]\ninput b[d]\ny = a + b\noutput y", PenroseCheckError,
     r"cannot broadcast 'b' with legs \[d\] against \[t, e\] in '\+'", 4, 9),
    ("shape index out of range", B + "y = x * x.shape[3]\noutput y", PenroseCheckError, r"'x' has 2 leg\(s\); shape index 3 is out of range", 3, 9),
    ("split parts", B + "a, b = split(x, e, [f, f])\noutput a", PenroseCheckError, r"split: parts \[f, f\] add up to 8 but leg 'e' has size 3", 3, 8),
    ("concat sizes", B + "y = concat([x, x], e, f)\noutput y", PenroseCheckError, r"concat: the parts add up to 6 but dim 'f' has size 4", 3, 23),
    ("topk k", B + "y = topk(x, e, k=5)\noutput y", PenroseCheckError, r"topk: k=5 must be between 1 and the size of leg 'e' \(3\)", 3, 5),
    ("dropout p", B + "y = dropout(x, p=1.5)\noutput y", PenroseCheckError, r"dropout: p must be in \[0, 1\), got 1.5", 3, 18),
    ("clamp bounds", B + "y = clamp(x, min=2, max=1)\noutput y", PenroseCheckError, r"clamp: min=2 is above max=1", 3, 5),
    ("causal takes dims", B + "m = causal(t, 3)\ny = where(m, x, 0)\noutput y", PenroseCheckError, r"causal takes two dims", 3, 15),
    # -- sizes
    ("einsum size conflict names both sizes", "dim t = 2, e = 3, d = 5\ninput Z[t, e]\nparam W[d, t]\ny = einsum('te,ed->td', Z, W)\noutput y",
     PenroseCheckError, r"size of label 'e' for operand 2 'W' leg 'd' \(5\) does not match operand 1 'Z' leg 'e' \(3\)", 4, 16),
    ("element-wise size conflict names both sizes", "dim t = 2, e = 3, d = 5\ninput a[t, e]\ninput b[t, d]\ny = a + b\noutput y",
     PenroseCheckError, r"size conflict in '\+'.*dim 'd' has size 5 but dim 'e' has size 3", 4, 5),
    ("block argument size conflict", "dim t = 2, e = 3, d = 5\ninput a[t, d]\nblock g(x[t, e]) {\n  return x\n}\ny = g(a)\noutput y",
     PenroseCheckError, r"size conflict in block 'g' argument 'x' leg 'e'.*size 3.*size 5|size 5.*size 3", 6, 7),
    ("dim size not whole", "dim e = 7, h = 2, d = e / h\ninput x[d]\noutput x", PenroseCheckError,
     r"7 / 2 is not a whole number; dim sizes are integers", 1, 23),
    ("dim size float", "dim e = 2.5\ninput x[e]\noutput x", PenroseCheckError, r"dim 'e' needs a whole-number size, got 2.5", 1, 9),
    ("dim size negative", "dim e = -2\ninput x[e]\noutput x", PenroseCheckError, r"dim 'e' would have a negative size \(-2\)", 1, 9),
    ("dim size unknown dim", "dim e = 7, d = e2 * 2\ninput x[d]\noutput x", PenroseCheckError,
     r"unknown dim 'e2' in the size of 'd'; did you mean 'e'\?", 1, 16),
    # -- dtypes
    ("ids in an einsum", B + "input ids[t] : int\ny = einsum('t,te->e', ids, x)\noutput y", PenroseCheckError,
     r"einsum operand 1 'ids' is an int tensor; use gather\(E, ids\)", 4, 23),
    ("gather needs int ids", "dim t = 2, v = 3, e = 2\ninput ids[t]\nparam E[v, e]\ny = gather(E, ids)\noutput y", PenroseCheckError,
     r"gather: argument 2 is a float tensor; expected int", 4, 15),
    ("arithmetic on a mask", "dim t = 2\ninput m[t] : bool\ny = m * 2\noutput y", PenroseCheckError,
     r"arithmetic on the bool mask 'm'; use where\(mask, a, b\)", 3, 5),
    ("where needs a mask", B + "y = where(x, x, 0)\noutput y", PenroseCheckError, r"where: the first argument must be a bool mask", 3, 11),
    ("unknown dtype", B + "input z[t] : float32\noutput z", PenroseCheckError, r"unknown dtype 'float32'; did you mean 'float'", 3, 1),
    ("param with batch legs", B + "param z[..., t]\noutput x", PenroseCheckError, r"a param has no batch legs", 3, 1),
    ("string as a value", B + "y = x * 'a'\noutput y", PenroseCheckError, r"a string is only allowed as an einsum spec", 3, 9),
    ("list as a value", B + "y = x * [1, 2]\noutput y", PenroseCheckError, r"a list is only allowed as an argument of split or concat", 3, 9),
    ("comparing numbers", B + "y = where(2 < 3, x, x)\noutput y", PenroseCheckError, r"comparing two plain numbers", 3, 11),
    ("function of a number", B + "y = x * relu(2)\noutput y", PenroseCheckError, r"relu of a plain number", 3, 9),
    # -- syntax errors (PenroseSyntaxError)
    ("unexpected character", B + "y = x $ 2\noutput y", PenroseSyntaxError, r"unexpected character '\$'", 3, 7),
    ("unexpected brace", B + "y = x }\noutput y", PenroseSyntaxError, r"unexpected character '\}'|unexpected '\}'", 3, 7),
    ("unexpected token", B + "y = x + * 2\noutput y", PenroseSyntaxError, r"unexpected '\*'", 3, 9),
    ("two statements on a line", B + "y = x = x\noutput y", PenroseSyntaxError, r"unexpected '='; statements are 'name = expression', one per line", 3, 7),
    ("unexpected end of file", B + "y = einsum('t->t', x)\noutput", PenroseSyntaxError, r"unexpected end of", 4, 7),
    # an unclosed bracket is reported at the bracket (issue 23), not where the parser stumbled
    ("unclosed bracket at the end", B + "y = einsum('t->t', x", PenroseSyntaxError, r"'\(' is never closed", 3, 11),
    ("unclosed bracket", B + "y = tanh(x\nz = y * 2\noutput z", PenroseSyntaxError, r"'\(' is never closed", 3, 9),
    ("unclosed leg list", "dim t = 2\ninput x[t\ny = x\noutput y", PenroseSyntaxError, r"'\[' is never closed", 2, 8),
    ("bracket closed by the other kind", B + "y = concat([x, x), t, t)\noutput y", PenroseSyntaxError,
     r"'\[' is never closed \(a '\)' comes first\)", 3, 12),
    ("unclosed block", "dim t = 2\nblock f(x[t]) {\n  return x\n", PenroseSyntaxError, r"unexpected end of file", 3, 11),
    ("'...' not first", "dim t = 2\ninput x[t, ...]\noutput x", PenroseSyntaxError, r"'\.\.\.' may only stand first among the legs", 2, 8),
    ("indexing", B + "y = x[0]\noutput y", PenroseSyntaxError, r"indexing is only supported as T.shape\[i\]", 3, 5),
    (".shape without index", B + "y = x.shape\noutput y", PenroseSyntaxError, r"'.shape' must be used as T.shape\[i\] or x.detach\(\)", 3, 5),
    ("shape index not a number", B + "y = x * x.shape[t]\noutput y", PenroseSyntaxError, r"a shape index must be a whole number", 3, 17),
    ("shape of an expression", B + "y = x * (x + 1).shape[0]\noutput y", PenroseSyntaxError, r"'.shape' is only available on a named tensor", 3, 9),
    ("unknown method", B + "y = x.clone()\noutput y", PenroseSyntaxError, r"unknown method '.clone\(\)'; the only method is .detach\(\)", 3, 5),
    ("positional after keyword", B + "y = clamp(x, min=0, 1)\noutput y", PenroseSyntaxError, r"a positional argument follows a keyword argument", 3, 21),
    ("positional init argument", B + "param W[e] ~ normal(1)\noutput x", PenroseSyntaxError, r"init arguments are written by keyword", 3, 21),
    ("'as' twice", "dim t = 2\nblock f(x[t]) {\n  return x\n}\ninput Z[t]\ny = f(Z) as a as b\noutput y", PenroseSyntaxError, r"'as' given twice", 6, 15),
    ("'repeat' twice", "dim t = 2\nblock f(x[t]) {\n  return x\n}\ninput Z[t]\ny = f(Z) repeat 2 repeat 3\noutput y", PenroseSyntaxError,
     r"'repeat' given twice", 6, 19),
    ("dtype on a param", B + "param z[t] : int\noutput x", PenroseSyntaxError, r"unexpected ':'", 3, 12),
]


@pytest.mark.parametrize("text, cls, message, line, col", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error(text, cls, message, line, col):
    with pytest.raises(PenroseError) as info:
        penrose.compile(text)
    e = info.value
    assert type(e) is cls, e.render()
    assert re.search(message, e.message), e.render()
    assert (e.line, e.col) == (line, col), e.render()
    assert e.file == "<string>"
    # the rendering: file:line:col, the source line, and a caret under the column
    rendered = e.render().split("\n")
    assert rendered[0].startswith(f"<string>:{line}:{col}: error: ")
    if len(rendered) >= 3 and not rendered[1].startswith("<string>"):
        assert rendered[2].index("^") == 4 + col - 1


# checker.py's docstring lists the rules under these headings; each maps to cases above (or tests below)
RULES = {
    "names": ["python keyword (tensor)", "reserved by the generated module", "duplicate dim", "duplicate block",
              "instance reused for another block", "undefined name, near miss", "unknown output", "block never returns",
              "block recursion", "test_include_cycle", "test_include_missing_file"],
    "legs": ["undeclared dim", "einsum term leg count", "einsum output leg in no input", "leg argument missing", "cannot broadcast"],
    "sizes": ["einsum size conflict names both sizes", "element-wise size conflict names both sizes", "block argument size conflict"],
    "dtypes": ["ids in an einsum", "gather needs int ids", "arithmetic on a mask", "where needs a mask"],
    "values": ["test_init_argument_out_of_range", "test_non_positive_eps", "test_negative_number_under_sqrt"],
    "usage": ["test_unused_input_and_param_are_warnings"],
}


def test_every_checker_rule_is_tested():
    """A new heading in checker.py's rule list needs cases here; every listed case exists."""
    headings = re.findall(r"^- (\w+):", check_module.__doc__, flags=re.M)
    assert headings == list(RULES)
    ids = {c[0] for c in CASES} | {n for n in globals() if n.startswith("test_")}
    for heading, cases in RULES.items():
        for case in cases:
            assert case in ids, (heading, case)


def test_error_in_a_file_names_the_file(tmp_path):
    f = tmp_path / "model.pen"
    f.write_text("dim t = 2\ninput x[t]\ny = sigmod(x)\noutput y\n", encoding="utf-8")
    with pytest.raises(PenroseCheckError) as info:
        penrose.compile(f)
    assert info.value.file == str(f)
    assert info.value.render().startswith(f"{f}:3:5: error: unknown function 'sigmod'; did you mean 'sigmoid'?")


def test_undeclared_leg_in_a_file_points_at_the_leg(tmp_path):
    f = tmp_path / "model.pen"
    f.write_text("dim t = 2, e = 3\ninput x[t, e]\nparam W[e, qq]\ny = einsum('te,eq->tq', x, W)\noutput y\n", encoding="utf-8")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(f)
    assert info.value.render().split("\n") == [
        f"{f}:3:12: error: undeclared dim 'qq' in param 'W'; declare it with 'dim qq = SIZE'",
        "    param W[e, qq]",
        "               ^~",
    ]


def test_undeclared_leg_in_an_included_block_names_that_file(tmp_path):
    (tmp_path / "lib.pen").write_text("dim t = 2\nblock f(h[t,\n          zz]) {\n  return h\n}\n", encoding="utf-8")
    main = tmp_path / "main.pen"
    main.write_text('dim e = 3\ninclude "lib.pen"\ninput x[t, e]\ny = f(x)\noutput y\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError, match="undeclared dim 'zz' in argument 'h'") as info:
        penrose.load(main)
    e = info.value
    assert (e.file, e.line, e.col) == (str(tmp_path / "lib.pen"), 3, 11)
    assert e.render().split("\n")[1:] == ["              zz]) {", "              ^~"]


def test_leg_spans_are_not_part_of_equality():
    a = penrose.parse("dim t = 2, e = 3\ninput x[t, e]\nparam W[e, t]\noutput x")
    b = penrose.parse("dim t = 2, e = 3\ninput x[ t,e ]\nparam   W[e,\n  t]\noutput x")
    assert a == b and hash(a.body[2]) == hash(b.body[2])
    x, w = b.body[2], b.body[3]
    assert x.legs == ("t", "e") and [(s.line, s.col, s.end_col) for s in x.leg_spans] == [(2, 10, 11), (2, 12, 13)]
    assert w.legs == ("e", "t") and [(s.line, s.col) for s in w.leg_spans] == [(3, 11), (4, 3)]
    batched = penrose.parse("dim t = 2\ninput x[..., t]\noutput x").body[1]
    assert batched.batched and [(s.line, s.col) for s in batched.leg_spans] == [(2, 14)]
    # a Tensor built by hand has no leg spans; errors then fall back to the declaration
    from penrose import ir

    t = ir.Tensor("input", "x", ("t",), span=Span("m.pen", 1, 1))
    assert t.leg_spans == () and t.leg_span(0) == t.span


def test_notes_point_at_both_places():
    with pytest.raises(PenroseCheckError) as info:
        penrose.load("dim t = 2\ndim t = 3\ninput Z[t]\noutput Z")
    (text, span), = info.value.notes
    assert text == "first declared here" and (span.line, span.col) == (1, 5)
    assert "<string>:1:5: note: first declared here" in info.value.render()


def test_unused_input_and_param_are_warnings():
    with pytest.warns(penrose.PenroseWarning, match="never used"):  # raised in Python too (test_penrose_warning.py)
        c = penrose.load("# index legend: t token\ndim t = 2\ninput x[t]\ninput unused[t]\nparam W[t]\noutput x")
    got = [(msg, span.line, span.col) for msg, span in c.warnings]
    assert got == [("input 'unused' is never used", 4, 1), ("param 'W' is never used", 5, 1)]


def test_unused_argument_in_a_block_is_a_warning():
    with pytest.warns(penrose.PenroseWarning, match="formal 'y' is never used"):
        c = penrose.load("# index legend: t token\ndim t = 2\nblock f(x[t], y[t]) {\n  return x\n}\ninput z[t]\nw = f(z, z)\noutput w")
    assert [(m, s.line) for m, s in c.warnings] == [("formal 'y' is never used", 3)]


def test_dims_missing_from_the_legend_are_warnings():
    c = penrose.load("# index legend: t token\ndim t = 2, e = 3\ninput x[t, e]\noutput x")
    assert [(m, s.line, s.col) for m, s in c.warnings] == [
        ("dim 'e' is not in the index legend (# index legend: e <meaning>)", 2, 12)]


def test_include_cycle(tmp_path):
    (tmp_path / "a.pen").write_text('include "b.pen"\ndim t = 2\n', encoding="utf-8")
    (tmp_path / "b.pen").write_text('dim e = 3\ninclude "a.pen"\n', encoding="utf-8")
    main = tmp_path / "main.pen"
    main.write_text('include "a.pen"\ninput x[t, e]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError) as info:
        penrose.load(main)
    e = info.value
    assert e.message == "include cycle: 'a.pen' includes itself"
    assert (e.file, e.line, e.col) == (str(tmp_path / "b.pen"), 2, 1)


def test_include_itself(tmp_path):
    f = tmp_path / "self.pen"
    f.write_text('dim t = 2\ninclude "self.pen"\ninput x[t]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError, match="include cycle") as info:
        penrose.load(f)
    assert (info.value.line, info.value.col) == (2, 1)


def test_include_missing_file(tmp_path):
    f = tmp_path / "main.pen"
    f.write_text('dim t = 2\ninclude "nope.pen"\ninput x[t]\noutput x\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError, match=r"cannot include 'nope.pen': no such file") as info:
        penrose.load(f)
    assert (info.value.line, info.value.col) == (2, 1)


def test_include_with_statements(tmp_path):
    (tmp_path / "lib.pen").write_text("dim t = 2\ninput x[t]\n", encoding="utf-8")
    f = tmp_path / "main.pen"
    f.write_text('include "lib.pen"\ninput y[t]\noutput y\n', encoding="utf-8")
    with pytest.raises(PenroseCheckError, match="has top-level statements") as info:
        penrose.load(f)
    e = info.value
    assert (e.file, e.line) == (str(tmp_path / "lib.pen"), 2)
    assert e.notes[0][0] == "included from here" and e.notes[0][1].line == 1


def test_syntax_error_in_an_included_file(tmp_path):
    (tmp_path / "lib.pen").write_text("dim t = = 2\n", encoding="utf-8")
    f = tmp_path / "main.pen"
    f.write_text('dim e = 2\ninclude "lib.pen"\ninput y[e]\noutput y\n', encoding="utf-8")
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.load(f)
    e = info.value
    assert (e.file, e.line, e.col) == (str(tmp_path / "lib.pen"), 1, 9)
    assert e.notes[0][1].line == 2


def test_unreadable_files(tmp_path):
    with pytest.raises(PenroseError, match="cannot read"):
        penrose.parse_file(tmp_path / "missing.pen")
    bad = tmp_path / "bad.pen"
    bad.write_bytes(b"dim e = 2\xff\n")
    with pytest.raises(PenroseSyntaxError, match=r"is not UTF-8 text \(invalid start byte at byte 9\)"):
        penrose.parse_file(bad)


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"foo": 3}, r"unknown dim 'foo' in sizes; the diagram declares e, t"),
        ({"tt": 3}, r"unknown dim 'tt' in sizes; did you mean 't'\?"),
        ({"e": -1}, r"size for dim 'e' must be a non-negative integer, got -1"),
        ({"e": 2.5}, r"size for dim 'e' must be a non-negative integer, got 2.5"),
        ({"e": True}, r"size for dim 'e' must be a non-negative integer, got True"),
    ],
)
def test_bad_size_overrides(sizes, message):
    with pytest.raises(PenroseCheckError, match=message):
        penrose.compile("dim t = 2, e = 3\ninput x[t, e]\noutput x", **sizes)


def test_compile_errors():
    with pytest.raises(PenroseCompileError, match=r"leg 't' has no size; pass t=N to compile\(\)") as info:
        penrose.compile("dim t\ninput x[t]\nparam W[t]\ny = x * W\noutput y")
    assert (info.value.line, info.value.col) == (2, 1)
    assert penrose.compile("dim t\ninput x[t]\nparam W[t]\ny = x * W\noutput y", t=3).W.shape == (3,)
    with pytest.raises(PenroseCompileError, match="exp of a size known only at run time") as info:
        penrose.compile("dim t = 2\ninput x[t]\ny = x * exp(t)\noutput y")
    assert (info.value.line, info.value.col) == (3, 9)


# ---- run time --------------------------------------------------------------------------------

RUNTIME = "dim t = 3, e = 4\ninput a[t, e]\ninput b[t]\nparam W[e] ~ ones\ny = a * b * W\noutput y\n"


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((torch.randn(3, 5), torch.randn(3)), {}, r"input 'a' leg 'e' must have size 4, got 5"),
        ((torch.randn(3, 4), torch.randn(2)), {}, r"input 'b' leg 't' has size 2 but input 'a' gave it size 3"),
        ((torch.randn(3, 4),), {}, r"missing input 'b' with legs \[t\]"),
        ((), {"b": torch.randn(3)}, r"missing input 'a' with legs \[t, e\]"),
        ((torch.randn(3, 4), torch.randn(3)), {"c": torch.randn(3)}, r"unexpected input\(s\): c; the diagram takes a, b"),
        ((torch.randn(3, 4), torch.randn(3), torch.randn(3)), {}, r"3 positional inputs given but the diagram takes 2: a, b"),
        ((torch.randn(4), torch.randn(3)), {}, r"input 'a' has 1 dimension\(s\) but needs at least 2 for legs \[t, e\]"),
        ((torch.randn(3, 4), [1.0, 2.0, 3.0]), {}, r"input 'b' must be a tensor, got list"),
        ((torch.ones(3, 4, dtype=torch.int64), torch.randn(3)), {}, r"input 'a' must be a floating-point tensor, got torch.int64"),
        ((torch.randn(2, 3, 4), torch.randn(5, 3)), {}, r"input 'b' has batch dims \[5\] but input 'a' has \[2\]; they must broadcast"),
    ],
    ids=["wrong size", "free leg disagrees", "missing", "missing first", "extra keyword", "extra positional", "rank",
         "not a tensor", "dtype", "batch dims"],
)
def test_runtime_input_errors(args, kwargs, message):
    m = penrose.compile(RUNTIME)
    with pytest.raises(PenroseShapeError, match=message):
        m(*args, **kwargs)


def test_runtime_errors_are_value_errors():
    m = penrose.compile(RUNTIME)
    with pytest.raises(ValueError):
        m(torch.randn(3, 5), torch.randn(3))
    assert m(torch.randn(2, 1, 3, 4), torch.randn(5, 3)).shape == (2, 5, 3, 4)  # batch dims broadcast


def test_runtime_dtype_of_ids_and_masks():
    m = penrose.compile("dim t = 2, v = 3, e = 2\ninput ids[t] : int\ninput m[t] : bool\nparam E[v, e]\n"
                        "y = where(m, sum(gather(E, ids), e), 0)\noutput y")
    with pytest.raises(PenroseShapeError, match=r"input 'ids' must hold integer ids, got torch.float32"):
        m(torch.zeros(2), torch.ones(2, dtype=torch.bool))
    with pytest.raises(PenroseShapeError, match=r"input 'm' must be a bool mask, got torch.int64"):
        m(torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long))


# ---- the reserved-name list ------------------------------------------------------------------


def test_module_attrs_cover_nn_module():
    """Every public attribute of torch.nn.Module is reserved, so the list never goes stale."""
    public = {n for n in dir(torch.nn.Module) if not n.startswith("_")}
    missing = public - check_module.MODULE_ATTRS
    assert not missing, f"add to penrose.checker.MODULE_ATTRS: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(n for n in dir(torch.nn.Module) if not n.startswith("_"))[:8] + ["training", "state_dict"])
def test_module_attr_names_are_rejected(name):
    with pytest.raises(PenroseCheckError, match=f"clashes with torch.nn.Module.{name}"):
        penrose.load(f"dim t = 2\ninput x[t]\nparam {name}[t]\ny = x * {name}\noutput y")


def test_error_without_position_renders_plainly():
    e = PenroseCheckError("something is off")
    assert e.render() == "error: something is off" and (e.line, e.col) == (0, 0)
    placed = e.with_span(Span("m.pen", 2, 3, 2, 5, "abcdef"))
    assert placed.render() == "m.pen:2:3: error: something is off\n    abcdef\n      ^~"
    assert placed.with_span(Span("other.pen", 9, 9)) is placed  # keeps its first position


def test_one_word_spaced_spec_is_read_as_words():
    # regression: 'tok, tok -> tok' used to be read as the letters t, o, k and fail on leg counts
    import torch

    m = penrose.compile("dim tok = 4\ninput a[tok]\ninput b[tok]\ny = einsum('tok, tok -> tok', a, b)\noutput y")
    assert torch.equal(m(torch.ones(4), torch.full((4,), 2.0)), torch.full((4,), 2.0))


# ---- values (tests/language/test_check_refusals.py holds every case of these rules) -------------------


def _refused(text):
    with pytest.raises(PenroseCheckError) as info:
        penrose.compile(text)
    return info.value


def test_init_argument_out_of_range():
    e = _refused(B + "param W[e] ~ normal(std=-1)\ny = x * W\noutput y")
    assert (e.message, e.line, e.col) == ("normal: std must be finite and at least 0, got -1", 3, 25)


def test_non_positive_eps():
    e = _refused(B + "y = layernorm(x, e, eps=-1)\noutput y")
    assert (e.message, e.line, e.col) == ("layernorm: eps must be positive, got -1", 3, 25)


def test_negative_number_under_sqrt():
    # regression: x / sqrt(-4) compiled to x / (-4) ** 0.5, and the output silently turned complex
    e = _refused(B + "y = x / sqrt(-4)\noutput y")
    assert (e.message, e.line, e.col) == ("sqrt of a negative number (-4); the result would not be real", 3, 9)


def test_unclosed_bracket_notes_where_the_statement_ended():
    """`y = tanh(x` then `z = y * 2`: reported at the '(' (3:9), the note at the end of line 3
    where the statement ended, then where the parser stopped (issue 23)."""
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.parse("dim t = 2\ninput x[t]\ny = tanh(x  # a note (\n\nz = y * 2\noutput z\n")
    e = info.value
    assert (e.line, e.col) == (3, 9) and e.message == "'(' is never closed"
    (ended, ended_at), (stopped, stopped_at) = e.notes
    assert ended == "the statement ends here, on line 3, with '(' still open" and (ended_at.line, ended_at.col) == (3, 10)
    assert stopped == "then the parser stopped: unexpected 'z'" and (stopped_at.line, stopped_at.col) == (5, 1)


def test_brackets_in_strings_and_comments_are_not_counted():
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.parse("dim t = 2\ninput x[t]  # (\ny = einsum('t->t', x  # ]\n")
    assert (info.value.line, info.value.col) == (3, 11)


def test_only_a_bracket_never_closed_is_blamed():
    """A later pair of brackets does not close the open one; an error inside brackets that close
    later keeps the parser's own message (a repeated keyword on a continued line)."""
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.parse("dim t = 2\ninput x[t]\ny = tanh(x\nz = tanh(y)\noutput z\n")
    assert (info.value.line, info.value.col, info.value.message) == (3, 9, "'(' is never closed")
    with pytest.raises(PenroseSyntaxError) as info:
        penrose.parse("dim t = 2\ninput x[t]\ny = layernorm(x, t,\n    eps=1e-5, eps=1e-6)\noutput y\n")
    assert info.value.message == "keyword argument 'eps' is repeated" and info.value.line == 4
