"""A command line's gin configuration, read and checked before the configurables load.

gin's own parser reads the files and bindings without resolving references, so
mistakes that need no configurable (a missing file, an unquoted string, a
misspelled or unset macro) are told in under a second: this module must not
import jax, TensorFlow, seqio or ``meshbayes.configurables``. It also gives
``meshbayes.launch`` the trained model's bindings (``model_bindings``) and gin's
file search (``search_prefixes``, ``quiet_search_misses``).
"""

from __future__ import annotations

import contextlib
import difflib
# gin's package-path reader calls importlib.util without importing it; before TensorFlow
# (which imports it) is loaded, a search for `dir/file.gin` would fail with AttributeError.
import importlib.util  # noqa: F401
import logging
import os
import re
import tokenize
from collections.abc import Iterator, Sequence, Set
from typing import Any, NamedTuple

import gin
from gin import config_parser

from meshbayes.field_checks import positive_int
from meshbayes.gin_configs import DIRECTORY as GIN_CONFIGS

# The training run's configuration in MODEL_DIR (meshbayes.training.trainer writes it), and the
# entry point whose `model` it configures (see model_bindings).
TRAINED_CONFIG = "config.gin"
_TRAIN_ENTRY_POINT = "train"
_REQUIRED = "gin.REQUIRED"
# What to do about a MODEL_DIR without a checkpoint (here and in training.checkpoints):
# the README's examples evaluate and decode make demo's runs.
TRAIN_FIRST = ("train first: meshbayes.train writes a run's checkpoints into its MODEL_DIR "
               "(make demo trains runs/demo/runs/bayesian and runs/demo/runs/deterministic)")

# train's parameters that moved into its grouped settings (meshbayes.training.run_configs):
# old parameter -> (configurable, parameter) to bind instead.
MOVED_TRAIN_PARAMETERS = {
    "checkpoint_period": ("run_configs.CheckpointConfig", "period"),
    "keep_checkpoints": ("run_configs.CheckpointConfig", "keep"),
    "async_checkpointing": ("run_configs.CheckpointConfig", "async_save"),
    "initial_checkpoint": ("run_configs.CheckpointConfig", "initial_checkpoint"),
    "initial_from_deterministic": ("run_configs.CheckpointConfig", "initial_from_deterministic"),
    "moped_delta": ("run_configs.CheckpointConfig", "moped_delta"),
    "fallback_on_corrupt_checkpoint": ("run_configs.CheckpointConfig", "fallback_on_corrupt"),
    "eval_period": ("run_configs.EvaluationConfig", "period"),
    "input_shards": ("run_configs.InputConfig", "shards"),
    "num_microbatches": ("run_configs.InputConfig", "num_microbatches"),
}
# evaluate's parameters that moved into its grouped settings (meshbayes.evaluation.settings).
MOVED_EVALUATE_PARAMETERS = {
    "decode": ("evaluation.DecodeConfig", "enabled"),
    "decode_method": ("evaluation.DecodeConfig", "method"),
    "beam_size": ("evaluation.DecodeConfig", "beam_size"),
    "sample_agreement": ("evaluation.DecodeConfig", "sample_agreement"),
    "method": ("evaluation.PredictiveConfig", "method"),
    "num_samples": ("evaluation.PredictiveConfig", "num_samples"),
    "ensemble_dirs": ("evaluation.PredictiveConfig", "ensemble_dirs"),
    "temperature_scaling": ("evaluation.PredictiveConfig", "temperature_scaling"),
    "temperature_split": ("evaluation.PredictiveConfig", "temperature_split"),
    "seed": ("evaluation.PredictiveConfig", "seed"),
    "ood_files": ("evaluation.OodConfig", "files"),
    "ood_targets_as_inputs": ("evaluation.OodConfig", "targets_as_inputs"),
    "ood_shuffled_words": ("evaluation.OodConfig", "shuffled_words"),
    "max_ood_examples": ("evaluation.OodConfig", "max_examples"),
    "num_bins": ("evaluation.ReportConfig", "num_bins"),
    "bootstrap_resamples": ("evaluation.ReportConfig", "bootstrap_resamples"),
    "output_dir": ("evaluation.ReportConfig", "output_dir"),
}
# Old parameters by entry point.
MOVED_PARAMETERS = {"train": MOVED_TRAIN_PARAMETERS, "evaluate": MOVED_EVALUATE_PARAMETERS}
# evaluate's mode flag that became a predictive method (meshbayes.evaluation.methods).
REPLACED_EVALUATE_FLAGS = {"mc_dropout": "mc_dropout"}


# Finding gin files as gin does.


def search_prefixes(paths: Sequence[str]) -> list[str]:
  """Where a gin file is looked for: as given, ``paths``, then the installed presets."""
  # The presets are found as `examples/x.gin` and as `gin_configs/examples/x.gin`, from any
  # working directory. '' first: gin tries a path as given before its search paths.
  return ["", *paths, str(GIN_CONFIGS), os.getcwd(), str(GIN_CONFIGS.parent)]


def safe_existence_checks() -> None:
  """gin's package-path reader raises TypeError for a directory without ``__init__.py``
  whose name starts an include (a ``runs/`` output directory shadows ``runs/train.gin``);
  make such checks answer "not here" so the search goes on."""
  def safe(exists):
    def check(path):
      try:
        return exists(path)
      except (TypeError, ValueError, ImportError):
        return False
    check.meshbayes_safe = True
    return check

  readers = gin.config._FILE_READERS  # no public way to wrap a registered reader
  readers[:] = [(r, e if getattr(e, "meshbayes_safe", False) else safe(e)) for r, e in readers]


@contextlib.contextmanager
def quiet_search_misses() -> Iterator[None]:
  """gin logs an error for every search path that lacks an included file; only a file
  found nowhere is one (and gin raises for that)."""
  class Filter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
      return not record.getMessage().startswith("Path not found:")

  quiet = Filter()
  logging.getLogger().addFilter(quiet)
  try:
    yield
  finally:
    logging.getLogger().removeFilter(quiet)


def _read_gin_file(name: str, prefixes: Sequence[str]) -> tuple[str, str]:
  """``(path, text)`` of a gin file, found as gin finds it."""
  for prefix in [""] if os.path.isabs(name) else prefixes:
    path = os.path.join(prefix, name)
    for reader, exists in gin.config._FILE_READERS:  # gin's readers, in gin's order
      if exists(path):
        with reader(path) as file:
          text = file.read()
        return path, text.decode() if isinstance(text, bytes) else text
  searched = ", ".join(dict.fromkeys(p for p in prefixes if p))
  known = [str(path.relative_to(GIN_CONFIGS)) for path in GIN_CONFIGS.rglob("*.gin")]
  raise FileNotFoundError(f"gin file {name!r} not found as given nor in {searched}"
                          + suggestion(name.removeprefix("gin_configs/"), known))


# Gin text, read without the configurables.


class _Reference(NamedTuple):
  """``@name``/``@name()`` (kind ``@``) or ``%NAME`` (kind ``%``), scopes dropped."""
  kind: str
  name: str


class _Recorder(config_parser.ParserDelegate):
  """Lets gin's parser read text without any configurable registered, noting the
  references of each statement; nothing is imported or bound."""

  def __init__(self):
    self.references: list[_Reference] = []

  def configurable_reference(self, scoped_name: str, evaluate: bool) -> _Reference:
    return self._note("@", scoped_name)

  def macro(self, name: str) -> _Reference:
    return self._note("%", name)

  def _note(self, kind: str, scoped_name: str) -> _Reference:
    reference = _Reference(kind, scoped_name.rsplit("/", 1)[-1])
    self.references.append(reference)
    return reference

  def take(self) -> tuple[_Reference, ...]:
    taken, self.references = tuple(self.references), []
    return taken


class _Binding(NamedTuple):
  """One gin binding: ``NAME = value`` (a macro, ``param`` empty) or
  ``selector.param = value``, in ``scope``."""
  scope: str
  selector: str
  param: str
  value: Any
  references: tuple[_Reference, ...]
  where: str  # FILE:LINE, or the flag it came from
  line: int

  @property
  def is_macro(self) -> bool:
    return not self.param

  @property
  def name(self) -> str:
    return self.selector if self.is_macro else f"{self.selector}.{self.param}"

  def is_required(self) -> bool:
    return isinstance(self.value, _Reference) and self.value.name == _REQUIRED

  def defines(self, reference: _Reference) -> bool:
    """Whether this binding is part of what ``reference`` stands for."""
    if reference.kind == "%":
      return self.is_macro and self.selector == reference.name
    return not self.is_macro and _same_configurable(self.selector, reference.name)


def _same_configurable(a: str, b: str) -> bool:
  """Whether two selectors name the same configurable: one is a dotted suffix of the
  other (gin writes the shortest unique one, references may be longer)."""
  a_parts, b_parts = a.split("."), b.split(".")
  n = min(len(a_parts), len(b_parts))
  return a_parts[-n:] == b_parts[-n:]


def _parse(text: str, where: str) -> list[tuple[Any, tuple[_Reference, ...]]]:
  """gin's statements in ``text``, each with its references.

  Raises:
    ValueError: a syntax error, as one line naming ``where`` and the line.
  """
  recorder = _Recorder()
  statements = []
  try:
    for statement in config_parser.ConfigParser(text, recorder):
      statements.append((statement, recorder.take()))
  except tokenize.TokenError as error:
    raise ValueError(f"{where}: cannot parse it ({error.args[0]}: a bracket or quote left "
                     "open?)") from None
  except (SyntaxError, ValueError) as error:
    line, content = getattr(error, "lineno", None), (getattr(error, "text", None) or "").strip()
    reason = re.sub(r"\s*\(line \d+\)$", "", str(error).strip().splitlines()[-1].strip())
    raise ValueError(f"{where}{f':{line}' if line else ''}: cannot parse"
                     f"{f' {content!r}' if content else ''} ({reason}); gin values are Python "
                     "literals (strings need quotes), @configurable() or %MACRO") from None
  return statements


def _bindings(statements: list[tuple[Any, tuple[_Reference, ...]]], where: str,
              numbered: bool = True) -> list[_Binding]:
  """The binding statements; each found at ``where:LINE`` (``where`` alone unless
  ``numbered``)."""
  return [_Binding(s.scope, s.selector, s.arg_name, s.value, refs,
                   f"{where}:{s.location.line_num}" if numbered else where, s.location.line_num)
          for s, refs in statements if isinstance(s, config_parser.BindingStatement)]


def _reached(bindings: Sequence[_Binding], roots: Sequence[_Reference]) -> list[_Binding]:
  """The bindings in effect (the last of each parameter) that ``roots`` lead to, through
  the macros and configurables each refers to; in their order."""
  effective = list({(b.scope, b.selector, b.param): b for b in bindings}.values())
  reached: set[int] = set()
  wanted = list(roots)
  while wanted:
    reference = wanted.pop()
    for binding in effective:
      if id(binding) not in reached and binding.defines(reference):
        reached.add(id(binding))
        wanted.extend(binding.references)
  return [b for b in bindings if id(b) in reached]


def _file_bindings(name: str, prefixes: Sequence[str]) -> list[_Binding]:
  """The bindings of a gin file and of the files it includes, in gin's order."""
  path, text = _read_gin_file(name, prefixes)
  bindings = []
  for statement, refs in _parse(text, path):
    if isinstance(statement, config_parser.IncludeStatement):
      bindings.extend(_file_bindings(statement.filename, prefixes))
    else:
      bindings.extend(_bindings([(statement, refs)], path))
  return bindings


class UnquotedStringError(ValueError):
  """A ``--gin.NAME=VALUE`` whose value is a bare word, not a Python literal.

  Attributes:
    quoted: the flag's bindings as they would be with the value quoted.
  """

  def __init__(self, message: str, quoted: Sequence[_Binding]):
    super().__init__(message)
    self.quoted = tuple(quoted)


def _flag_bindings(flag: str, binding: str) -> list[_Binding]:
  """The bindings of one ``--gin.NAME=VALUE``; an unquoted string is a one-line
  ``UnquotedStringError`` showing the quoted form."""
  try:
    return _bindings(_parse(binding, flag), flag, numbered=False)
  except ValueError:
    key, _, value = (part.strip() for part in binding.partition("="))
    if value and value[0] not in "[({'\"@%":
      try:
        quoted = _bindings(_parse(f"{key} = {value!r}", flag), flag, numbered=False)
      except ValueError:  # the name is malformed too: the quotes are the first thing to tell
        quoted = []
      raise UnquotedStringError(f"{flag}: gin values are Python literals and {value} is not "
                                f"one; a string needs quotes: --gin.{key}=\"{value!r}\"",
                                quoted) from None
    raise ValueError(f"{flag}: {value!r} is not a gin value (a Python literal, "
                     "@configurable() or %MACRO)") from None


def _command_line_bindings(flags: Sequence[tuple[str, str]], entry_point: str,
                           macros: Set[str]) -> list[_Binding]:
  """The bindings of the ``--gin.NAME=VALUE`` flags; an unquoted string that also binds a
  former parameter is one error naming both fixes (see ``check_moved_names``)."""
  bindings = []
  for flag, binding in flags:
    try:
      bindings.extend(_flag_bindings(flag, binding))
    except UnquotedStringError as error:
      for quoted in error.quoted:
        moved = _replacement(quoted, None if quoted.selector in macros else entry_point)
        if moved:
          old, configurable, param, value, _ = moved
          raise ValueError(f"{flag}: {old} moved, and gin values are Python literals "
                           f"({binding.partition('=')[2].strip()} is not one): bind "
                           f"{configurable}.{param} with the string quoted, "
                           f"{_example(quoted, configurable, param, value)}") from None
      raise
  return bindings


def _gin_value_text(value: Any) -> str:
  if isinstance(value, _Reference):
    return f"{value.kind}{value.name}" + ("()" if value.kind == "@" else "")
  return repr(value)


def _replacement(binding: _Binding, entry_point: str | None = None
                 ) -> tuple[str, str, str, Any, str] | None:
  """``(former name, configurable, parameter, value, note)`` of the binding that replaces
  ``binding`` when it binds one of ``train``'s or ``evaluate``'s former parameters
  (``MOVED_PARAMETERS``, ``REPLACED_EVALUATE_FLAGS``), else None.

  A macro binding (``--gin.fallback_on_corrupt_checkpoint=True``: the parameter's name
  alone) counts as one of ``entry_point``'s parameters (None: it never counts).
  """
  if binding.is_macro:
    old, name = binding.selector, f"{entry_point}.{binding.selector}"
  else:
    entry_point, old = binding.selector.rsplit(".", 1)[-1], binding.param
    name = binding.name
  if entry_point == "evaluate" and old in REPLACED_EVALUATE_FLAGS:
    configurable, param = MOVED_EVALUATE_PARAMETERS["method"]
    return (name, configurable, param, REPLACED_EVALUATE_FLAGS[old],
            ", or drop it for the run as trained")
  if old in MOVED_PARAMETERS.get(entry_point, {}):
    configurable, param = MOVED_PARAMETERS[entry_point][old]
    return name, configurable, param, binding.value, ""
  return None


def check_moved_names(bindings: Sequence[_Binding], entry_point: str | None = None,
                      macros: Set[str] = frozenset()) -> None:
  """Raises a one-line ValueError for a binding of one of ``train``'s or ``evaluate``'s
  former parameters (``_replacement``), naming the binding that replaces it, in its own
  form; with ``entry_point``, a macro binding that is none of ``macros`` (the
  configuration's) and bears the name of one of its former parameters counts too."""
  for binding in bindings:
    moved = _replacement(binding, None if binding.selector in macros else entry_point)
    if moved:
      old, configurable, param, value, note = moved
      example = _example(binding, configurable, param, value)
      raise ValueError(f"{binding.where}: {old} moved: bind {configurable}.{param} (e.g. "
                       f"{example}){note}")


def _example(binding: _Binding, configurable: str, param: str, value: Any) -> str:
  """``configurable.param = value`` as the binding's own form writes it (a file's line, or
  a ``--gin.`` flag, where a string needs both quotes)."""
  text = _gin_value_text(value)
  if binding.where.startswith("--gin."):
    return f"--gin.{configurable}.{param}=" + (f'"{text}"' if isinstance(value, str) else text)
  return f"{configurable}.{param} = {text}"


def _macro_names(bindings: Sequence[_Binding]) -> set[str]:
  """The macros that ``bindings`` refer to or set."""
  return ({r.name for b in bindings for r in b.references if r.kind == "%"}
          | {b.selector for b in bindings if b.is_macro})


def _macro_value(bindings: Sequence[_Binding], name: str) -> Any:
  values = [b.value for b in bindings if b.defines(_Reference("%", name))]
  return values[-1] if values else None


def suggestion(name: str, candidates: Sequence[str]) -> str:
  """``'; did you mean A or B?'`` with the candidates nearest ``name``, or ``''``."""
  close = difflib.get_close_matches(name, list(candidates), n=3)
  return f"; did you mean {' or '.join(close)}?" if close else ""


def _check_bindings(bindings: Sequence[_Binding], command_line: Sequence[_Binding],
                    entry_point: str, trained: Sequence[_Binding] = ()) -> None:
  """What can be told of a configuration without its configurables.

  Args:
    bindings: every binding, in the order gin applies them (``command_line`` last).
    command_line: the bindings of the command line's ``--gin.NAME=VALUE`` flags.
    entry_point: the configurable the command calls.
    trained: the bindings of the training run's model (applied first).

  Raises:
    ValueError: a macro of the command line that nothing refers to (a typo:
      it would have no effect), with the nearest known names; or a
      ``%gin.REQUIRED`` macro that the entry point uses and nothing sets (or that a
      file sets before another file requires it again: the files' order).
  """
  flags = {id(b) for b in command_line}
  from_files = [b for b in bindings if id(b) not in flags]
  known = (_macro_names(from_files)
           | {r.name for b in command_line for r in b.references if r.kind == "%"}) - {_REQUIRED}
  for binding in command_line:
    if binding.is_macro and binding.selector not in known:
      raise ValueError(
          f"{binding.where}: no gin macro {binding.selector} in the configuration (nothing "
          f"refers to %{binding.selector})" + suggestion(
              binding.selector,
              sorted(known) + sorted({b.name for b in from_files if not b.is_macro})))
  required = [b for b in _reached(bindings, [_Reference("@", entry_point)])
              if b.is_macro and b.is_required()]
  for binding in required:  # set by an earlier file, then required again by a later one
    earlier = [b for b in bindings[:bindings.index(binding)]
               if b.defines(_Reference("%", binding.selector)) and not b.is_required()
               and b not in trained]
    if earlier:
      raise ValueError(
          f"gin macro {binding.selector} is set in {earlier[-1].where} but reset to "
          f"%gin.REQUIRED by {binding.where}, which comes after it: gin applies files in "
          f"order, so give {binding.where.rsplit(':', 1)[0]} before "
          f"{earlier[-1].where.rsplit(':', 1)[0]}")
  missing = [b.selector for b in required]
  if len(missing) == 1:
    raise ValueError(f"gin macro {missing[0]} is %gin.REQUIRED but not set; set it with "
                     f"--gin.{missing[0]}=VALUE")
  if missing:
    raise ValueError(f"gin macros {', '.join(missing)} are %gin.REQUIRED but not set; set them "
                     f"with {' '.join(f'--gin.{name}=VALUE' for name in missing)}")


# The model of a training run.


def model_bindings(config_text: str, where: str = TRAINED_CONFIG) -> str:
  """The part of a training run's ``config.gin`` that configures its model, as gin text.

  The model is what the training entry point's ``model`` parameter refers to
  (``train.model = %MODEL``): followed through macros and configurables
  (``MODEL``, then ``models.EncoderDecoderModel`` and its ``config``, ...),
  the bindings of each, with the file's imports. The training loop, data and
  partitioning are left out. Empty when the file has no ``train.model``.
  """
  statements = _parse(config_text, where)
  bindings = _bindings(statements, where)
  roots = [r for b in bindings if b.param == "model"
           and _same_configurable(b.selector, _TRAIN_ENTRY_POINT) for r in b.references]
  kept = {b.line for b in _reached(bindings, roots)}
  if not kept:
    return ""
  kept |= {s.location.line_num for s, _ in statements
           if isinstance(s, config_parser.ImportStatement)}
  lines = config_text.splitlines(keepends=True)
  starts = [s.location.line_num for s, _ in statements] + [len(lines) + 1]
  return "".join(_statement_text(lines[start - 1:end - 1])
                 for start, end in zip(starts, starts[1:]) if start in kept)


def _statement_text(lines: list[str]) -> str:
  """A statement's lines, from its first to the next statement's, less the comments and
  blank lines before that one."""
  while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("#")):
    lines = lines[:-1]
  return "".join(lines)


def bound_values(text: str, where: str = TRAINED_CONFIG) -> dict[tuple[str, str], Any]:
  """The values ``text``'s unscoped bindings give, by ``(configurable's last name,
  parameter)``, the last binding of each winning; a ``%MACRO`` value is the macro's own
  (None when the text sets none), a ``@configurable`` stays a reference. Nothing is
  imported or bound.

  Raises:
    ValueError: the text does not parse (one line naming ``where``).
  """
  bindings = [b for b in _bindings(_parse(text, where), where) if not b.scope]

  def value(bound: Any) -> Any:
    is_macro = isinstance(bound, _Reference) and bound.kind == "%"
    return _macro_value(bindings, bound.name) if is_macro else bound

  return {(b.selector.rsplit(".", 1)[-1], b.param): value(b.value)
          for b in bindings if not b.is_macro}


def _trained_model(model_dir: Any) -> tuple[str, str]:
  """``(path, model bindings)`` of ``MODEL_DIR/config.gin``, or ``('', '')`` without one."""
  if not isinstance(model_dir, str) or not model_dir:
    return "", ""
  from etils import epath  # only eval and infer need it

  path = epath.Path(model_dir) / TRAINED_CONFIG
  if not path.exists():
    return "", ""
  return str(path), model_bindings(path.read_text(), str(path))


def _check_trained_run(model_dir: Any) -> None:
  """Raises a one-line ValueError when MODEL_DIR (a string) holds no training run: no
  ``config.gin`` and no ``checkpoints/``."""
  if not isinstance(model_dir, str) or not model_dir:
    return  # unset: the missing macro is told by the bindings' check
  from etils import epath

  path = epath.Path(model_dir)
  if (path / TRAINED_CONFIG).exists() or (path / "checkpoints").exists():
    return
  what = ("does not exist" if not path.exists() else "is a file" if path.is_file()
          else "holds no training run (no config.gin, no checkpoints/)")
  raise ValueError(f"MODEL_DIR {model_dir!r} {what}, so it has no checkpoint; {TRAIN_FIRST}")


def _check_train_values(model_dir: Any, train_steps: Any) -> None:
  """The training run's simple values, checked in the first second (the trainer checks
  them again, after the training split is counted): one-line ValueErrors."""
  if not isinstance(train_steps, (_Reference, type(None))):
    positive_int("train", "train_steps", train_steps)
  if isinstance(model_dir, str) and model_dir and "://" not in model_dir:
    path = os.path.abspath(model_dir)
    while path != os.path.dirname(path) and not os.path.exists(path):
      path = os.path.dirname(path)
    if os.path.isfile(path):
      raise ValueError(f"train: MODEL_DIR {model_dir} must be a directory, but {path} is a file")


# The configuration of a command line.


def checked_configuration(files: Sequence[str], flags: Sequence[tuple[str, str]],
                          prefixes: Sequence[str], entry_point: str,
                          model_from_model_dir: bool) -> tuple[Any, str, str]:
  """Reads the gin files and bindings without the configurables and checks them.

  Args:
    files: the ``--gin_file`` names, found on ``prefixes`` (``search_prefixes``).
    flags: ``(flag, gin binding)`` of each ``--gin.NAME=VALUE``, in order.
    prefixes: where the files are looked for.
    entry_point: the configurable the command calls.
    model_from_model_dir: the training run's model (``MODEL_DIR/config.gin``)
      applies first.

  Returns:
    MODEL_DIR's value (None if unset), and the path and model bindings of its
    ``config.gin`` (empty unless ``model_from_model_dir`` and the file exists).

  Raises:
    ValueError: a binding that cannot be parsed, one of ``train``'s or ``evaluate``'s
      former parameters (``check_moved_names``), a macro of the command line that
      nothing refers to, or a ``%gin.REQUIRED`` macro left unset.
    FileNotFoundError: a gin file found nowhere.
  """
  safe_existence_checks()
  with quiet_search_misses():
    from_files = [b for name in files for b in _file_bindings(name, prefixes)]
  macros = _macro_names(from_files)
  command_line = _command_line_bindings(flags, entry_point, macros)
  check_moved_names(from_files)
  check_moved_names(command_line, entry_point, macros)
  model_dir = _macro_value(from_files + command_line, "MODEL_DIR")
  if model_from_model_dir:
    _check_trained_run(model_dir)
  elif entry_point == _TRAIN_ENTRY_POINT:
    _check_train_values(model_dir, _macro_value(from_files + command_line, "TRAIN_STEPS"))
  path, trained = _trained_model(model_dir) if model_from_model_dir else ("", "")
  from_run = _bindings(_parse(trained, path), path)
  _check_bindings(from_run + from_files + command_line, command_line, entry_point, from_run)
  return model_dir, path, trained
