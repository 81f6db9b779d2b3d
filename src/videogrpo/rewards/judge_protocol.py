"""What the VLM judge is sent and what it must answer (docs/reference-system.md#vlm-judge), in one place that the
tests read too.

Two pinned external sources feed it, both Python modules that are parsed with `ast` and never imported or run
(a pinned file still should not get to execute code in the trainer): the rubric source (`EVAL_PROMPTS`, a dict
literal: task -> rubric) and the protocol source (the string literals TASK_VLM_JUDGE_OUTPUT_REMINDER and
TASK_VLM_JUDGE_REPAIR_PROMPT, the two fixed texts of the conversation, not ours to write). Each is checked
against the plain SHA-256 its config field pins.

A rubric's "Output format (exactly these lines):" section names the answer's fields, in order: one line
`<field>: <0-100>` each, `reason: <text>` last. The request asks for exactly those lines twice over: in words
(the reminder) and as a structured-output regex the server decodes under; the answer is then validated
against the same field list, because a regex cannot check that the weights add up to 100.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from videogrpo.errors import ConfigError, DigestMismatch

OUTPUT_MARKER = "Output format (exactly these lines):"
REMINDER = "TASK_VLM_JUDGE_OUTPUT_REMINDER"
REPAIR = "TASK_VLM_JUDGE_REPAIR_PROMPT"
IMAGE_EDGE = 512
"""Longest edge of the first frame and of the rollout video: larger ones are scaled down, never up."""
JPEG_QUALITY = 85
MP4_QUALITY = 8
"""imageio's FFmpeg writer quality (0-10) of the rollout MP4."""
MAX_TOKENS = 1024
REPAIR_ERROR_CHARS = 300
"""How much of a validation error the repair request quotes."""
# A number the judge may write: 0-100, an optional fraction, no sign, exponent or leading zero.
NUMBER = r"(?:100(?:\.0+)?|[1-9]?[0-9](?:\.[0-9]+)?)"
_FIELD_LINE = re.compile(r"^([a-z][a-z0-9_]*):", re.MULTILINE)
_ANSWER_LINE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*:\s*(.*?)\s*$")


class RubricError(ValueError):
    """A rubric whose output section does not define a valid field list."""


class JudgeAnswerError(ValueError):
    """The judge's answer breaks the rubric's output contract; the message is quoted in the repair request."""


@dataclass(frozen=True)
class Protocol:
    """The two fixed texts of the judge conversation, from the pinned protocol source."""

    reminder: str
    """Closes every request: answer in the rubric's output format, weights adding up to 100, nothing else."""
    repair: str
    """Opens a repair request after an invalid answer; the validation error follows it."""


@dataclass(frozen=True)
class Verdict:
    score: float
    """total_score / 100."""
    values: dict[str, float]
    """Every numeric field of the answer, in the rubric's order."""
    reason: str


def read_pinned(path: str | Path, expected_sha256: str, field: str, what: str) -> bytes:
    """The bytes of a pinned source file, refused unless their plain SHA-256 is the one `field` pins."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{field} = {str(path)!r}: no such file; point it at the {what}")
    data = path.read_bytes()
    found = hashlib.sha256(data).hexdigest()
    if found != expected_sha256:
        raise DigestMismatch(
            f"{path}: {what} digest mismatch\n  expected {expected_sha256} ({field}_digest)\n  found    {found}\n"
            f"Restore the file, or pin the new digest (a new scorer contract: a new run)."
        )
    return data


def _assignments(path: Path, data: bytes, names: tuple[str, ...]) -> dict[str, ast.expr]:
    """The value expressions of the module-level `NAME = ...` statements for `names`, found without running it."""
    try:
        tree = ast.parse(data, filename=str(path))
    except (SyntaxError, ValueError) as err:
        raise ConfigError(f"{path}: not a Python module the judge can read ({err})") from None
    found: dict[str, ast.expr] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in names:
                if target.id in found:
                    raise ConfigError(f"{path}: {target.id} is assigned more than once; which one is pinned?")
                found[target.id] = value
    return found


def load_protocol(path: str | Path, expected_sha256: str) -> Protocol:
    """The judge's fixed texts from the pinned protocol source (reward.judge_protocol)."""
    data = read_pinned(path, expected_sha256, "reward.judge_protocol", "judge protocol source")
    path = Path(path)
    values = _assignments(path, data, (REMINDER, REPAIR))
    texts = []
    for name in (REMINDER, REPAIR):
        if name not in values:
            raise ConfigError(f"{path}: defines no {name}; reward.judge_protocol must be the judge protocol module")
        node = values[name]
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            raise ConfigError(
                f"{path}: {name} is not a plain string literal (found {type(node).__name__} at line {node.lineno}); "
                f"the judge reads it without running the file"
            )
        texts.append(node.value)
    return Protocol(*texts)


def load_rubrics(path: str | Path, expected_sha256: str, tasks: list[str] | None = None) -> dict[str, str]:
    """EVAL_PROMPTS of the pinned rubric source (reward.judge_prompts): every rubric's output section must parse,
    and every task in `tasks` must have one."""
    data = read_pinned(path, expected_sha256, "reward.judge_prompts", "rubric source")
    path = Path(path)
    node = _assignments(path, data, ("EVAL_PROMPTS",)).get("EVAL_PROMPTS")
    if node is None:
        raise ConfigError(f"{path}: defines no EVAL_PROMPTS (a dict literal: task name -> rubric text)")
    try:
        rubrics = ast.literal_eval(node)
    except ValueError:
        rubrics = None
    if not isinstance(rubrics, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rubrics.items()):
        raise ConfigError(f"{path}: EVAL_PROMPTS is not a dict literal of strings (task name -> rubric text)")
    for task, rubric in rubrics.items():
        try:
            output_fields(rubric)
        except RubricError as err:
            raise ConfigError(f"{path}: the rubric of task {task!r} {err}") from None
    missing = [t for t in tasks or [] if t not in rubrics]
    if missing:
        raise ConfigError(
            f"{path}: no rubric for task(s) {missing}; the source covers {len(rubrics)} tasks "
            f"(e.g. {sorted(rubrics)[:3]}): use the prompt source for this dataset"
        )
    return rubrics


def output_fields(rubric: str) -> list[str]:
    """The answer's fields, in order: the `name:` lines after the rubric's output marker."""
    _, marker, section = rubric.partition(OUTPUT_MARKER)
    if not marker:
        raise RubricError(f"has no {OUTPUT_MARKER!r} section")
    fields = _FIELD_LINE.findall(section)
    if fields[-2:] != ["total_score", "reason"]:
        raise RubricError(f"lists the output fields {fields}: the last two must be total_score and reason")
    repeated = sorted({f for f in fields if fields.count(f) > 1})
    if repeated:
        raise RubricError(f"lists the output field(s) {repeated} more than once")
    return fields


def output_regex(rubric: str) -> str:
    """The structured-output constraint: the rubric's lines in its order, numbers 0-100, a non-empty reason."""
    return "\n".join(r"reason: [^\n]+" if f == "reason" else f"{f}: {NUMBER}" for f in output_fields(rubric))


def validate_answer(answer: str, fields: list[str]) -> Verdict:
    """Exactly one line per field (a missing or repeated one is invalid), every number finite in [0, 100], a
    non-empty reason, and the `*_weight` values adding up to 100 within 0.5."""
    seen: dict[str, list[str]] = {}
    for line in answer.splitlines():
        if m := _ANSWER_LINE.match(line):
            seen.setdefault(m.group(1), []).append(m.group(2))
    values: dict[str, float] = {}
    reason = ""
    for name in fields:
        lines = seen.get(name, [])
        if len(lines) != 1:
            problem = "no" if not lines else f"{len(lines)}"
            raise JudgeAnswerError(f"the answer has {problem} `{name}:` lines, it needs exactly one")
        if name == "reason":
            reason = lines[0].strip()
            if not reason:
                raise JudgeAnswerError("the `reason:` line is empty")
            continue
        try:
            value = float(lines[0])
        except ValueError:
            raise JudgeAnswerError(f"`{name}` is {lines[0]!r}, not a number") from None
        if not (math.isfinite(value) and 0 <= value <= 100):
            raise JudgeAnswerError(f"`{name}` is {lines[0]}, outside 0-100")
        values[name] = value
    weights = [v for name, v in values.items() if name.endswith("_weight")]
    if not weights:
        raise JudgeAnswerError("the answer has no `*_weight` lines")
    if abs(sum(weights) - 100) > 0.5:
        raise JudgeAnswerError(f"the *_weight values add up to {sum(weights):g}, not 100")
    return Verdict(values["total_score"] / 100.0, values, reason)


def repair_text(protocol: Protocol, error: str) -> str:
    return f"{protocol.repair}\nValidation error: {error[:REPAIR_ERROR_CHARS]}"


def jpeg_data_url(image: np.ndarray) -> str:
    """The first frame as a JPEG data URL: scaled down (Lanczos, aspect kept) to fit IMAGE_EDGE, quality 85."""
    from PIL import Image

    picture = Image.fromarray(image).convert("RGB")
    if max(picture.size) > IMAGE_EDGE:
        picture.thumbnail((IMAGE_EDGE, IMAGE_EDGE), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=JPEG_QUALITY, optimize=False)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def mp4_data_url(frames: np.ndarray, fps: int) -> str:
    """The whole rollout as an in-memory H.264 MP4 data URL (yuv420p): every frame, at `fps`."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames) or frames.dtype != np.uint8:
        raise ValueError(f"a rollout must be uint8 [frames, height, width, 3], not {frames.dtype} {frames.shape}")
    height, width = frames.shape[1:3]
    if max(height, width) > IMAGE_EDGE:
        from PIL import Image

        scale = IMAGE_EDGE / max(height, width)
        # yuv420p needs even sides
        size = tuple(max(2, round(side * scale)) // 2 * 2 for side in (width, height))
        frames = np.stack([np.asarray(Image.fromarray(f).resize(size, Image.Resampling.LANCZOS)) for f in frames])
    elif height % 2 or width % 2:
        raise ValueError(f"the judge's MP4 (yuv420p) needs even sides, not {width}x{height}")
    import imageio.v3 as iio

    data = iio.imwrite(
        "<bytes>",
        np.ascontiguousarray(frames),
        extension=".mp4",
        plugin="FFMPEG",
        fps=fps,
        codec="libx264",
        pixelformat="yuv420p",
        quality=MP4_QUALITY,
        macro_block_size=None,
        ffmpeg_log_level="error",
    )
    if not data:
        raise ValueError("the MP4 writer returned no bytes")
    return "data:video/mp4;base64," + base64.b64encode(data).decode("ascii")


def request_body(
    model: str, protocol: Protocol, rubric: str, first_frame: np.ndarray, frames: np.ndarray, fps: int, sampled: int
) -> dict:
    """The chat-completions request for one rollout: one user message of six parts, greedy, constrained decoding."""
    content = [
        {"type": "text", "text": rubric.strip()},
        {"type": "text", "text": "First frame (input):"},
        {"type": "image_url", "image_url": {"url": jpeg_data_url(first_frame)}},
        {
            "type": "text",
            "text": f"Generated video ({len(frames)} source frames encoded at {fps} FPS, chronological order):",
        },
        {"type": "video_url", "video_url": {"url": mp4_data_url(frames, fps)}},
        {"type": "text", "text": protocol.reminder},
    ]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        "seed": 0,
        "chat_template_kwargs": {"enable_thinking": False},
        # vLLM's OpenCV loader takes `sampled` frames uniformly over the whole video, and the processor keeps them.
        "media_io_kwargs": {"video": {"video_backend": "opencv", "num_frames": sampled, "fps": -1}},
        "mm_processor_kwargs": {"do_sample_frames": False},
        "structured_outputs": {"regex": output_regex(rubric)},
    }
