"""What ``--dtype auto`` probes a reduced precision with: fixed texts and the bar (data only).

Drawn from the calibration sample (model/calibration_texts.py, never edited in
place, so the picks are stable): a handful of short texts in different scripts
(Latin, Cyrillic, Arabic, Devanagari, CJK, Hangul, diacritics, emoji) and one
passage of about 200 tokens, since rounding error accumulates over the
length a vector is pooled from. Small on purpose: the probe runs at every
start, in float32 and in the candidate dtype. How the bar applies to
vectors and to scores is engine/dtype_choice.py's.
"""

from __future__ import annotations

from embedserve.model.calibration_texts import CALIBRATION_TEXTS

_SHORT = (0, 61, 102, 132, 142, 156, 162, 167, 187, 193)
# The first 14 English texts in one passage: the long-sequence case.
_PASSAGE = " ".join(CALIBRATION_TEXTS[:14])

PROBE_TEXTS: tuple[str, ...] = (*(CALIBRATION_TEXTS[i] for i in _SHORT), _PASSAGE)

# The smallest cosine between a probe text's vector in the candidate dtype and in
# float32 that keeps the candidate (``--dtype-probe-min-cosine``).
# bf16 keeps 8 significant bits, so single values round by up to 0.4 %; pooled
# over a sequence the errors mostly cancel. Measured on an AMX CPU (oneDNN bf16
# path): the default model's smallest cosine on these texts is 0.99997, the tests'
# tiny random encoders 0.99994-0.99998. A bf16 path that rounds more (activations
# kept in bf16 between layers, say) has 3e-5 of room before auto falls back.
DEFAULT_PROBE_MIN_COSINE = 0.9999
