"""Fixed texts of the VLM judge protocol for the synthetic tasks, in the layout of the reference's protocol module.

Like the real one (an external module, pinned by the SHA-256 of this file in reward.judge_protocol_digest), it
defines two string constants: the reminder that closes every judge request, and the text that opens a repair
request after an invalid answer (the validation error follows it). The judge client parses them out of this
file with `ast`; it never imports or runs it.
"""

TASK_VLM_JUDGE_OUTPUT_REMINDER = (
    "Now answer in the rubric's \"Output format (exactly these lines)\": every listed line once, in the listed "
    "order. Check that the *_weight values add up to exactly 100. Write those lines only: no working, no titles, "
    "no lists, no Markdown, no code fences."
)
TASK_VLM_JUDGE_REPAIR_PROMPT = (
    "The answer above was rejected by the checker. Fix the problem it reports, work the *_weight values out again "
    "so that they add up to exactly 100, and send the whole answer once more, every line in the rubric's order, "
    "with nothing around it."
)
