"""A cheap language guess: Unicode script first, then stopword counts for Latin-script text.

Good enough to tell "answered in English when French was asked for", and nothing more. It
returns ``None`` whenever the evidence is thin, and the caller then judges nothing.
"""

from __future__ import annotations

import re

LANGUAGE_NAMES: dict[str, str] = {
    "english": "en",
    "french": "fr",
    "german": "de",
    "spanish": "es",
    "italian": "it",
    "portuguese": "pt",
    "dutch": "nl",
    "russian": "ru",
    "ukrainian": "ru",
    "chinese": "zh",
    "mandarin": "zh",
    "japanese": "ja",
    "korean": "ko",
    "arabic": "ar",
    "greek": "el",
    "hebrew": "he",
    "hindi": "hi",
    "thai": "th",
}
"""Language names as written in prompts. Cyrillic languages share one code: we only see script."""

_STOPWORDS: dict[str, frozenset[str]] = {
    "en": frozenset(
        "the and is are of to was were with that this it for you not be have has which what "
        "from by on at an they there will would can i my your their been does".split()
    ),
    "fr": frozenset(
        "le les et est une un des du dans pour que qui pas sur avec ce cette sont nous vous il "
        "elle au aux je mais ou très été être avoir sa son ses leur".split()
    ),
    "de": frozenset(
        "der die das und ist nicht ein eine mit den dem zu von sich auf für ich sie es wir auch "
        "sind wird nach bei einen oder aber wie".split()
    ),
    "es": frozenset(
        "el los las y es una del que por para con no se su al lo como más pero está son muy "
        "yo sus este esta ser hay".split()
    ),
    "it": frozenset(
        "il lo gli e è di che per una un non con sono della del nel alla anche come più ma ho "
        "questo questa essere le".split()
    ),
    "pt": frozenset(
        "o os as e é um uma do da dos das que não para com em no na por se mais como são "
        "isso este esta ser".split()
    ),
    "nl": frozenset(
        "de het een en is van niet dat die op te voor met zijn ook maar je ik wat er naar "
        "worden wordt".split()
    ),
}

_SCRIPTS: tuple[tuple[str, int, int], ...] = (
    ("ru", 0x0400, 0x04FF),
    ("el", 0x0370, 0x03FF),
    ("he", 0x0590, 0x05FF),
    ("ar", 0x0600, 0x06FF),
    ("hi", 0x0900, 0x097F),
    ("th", 0x0E00, 0x0E7F),
    ("ja", 0x3040, 0x30FF),
    ("ko", 0xAC00, 0xD7AF),
    ("zh", 0x4E00, 0x9FFF),
)

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_CODE = re.compile(r"```.*?(?:```|$)|`[^`]*`", re.DOTALL)
_NAMES = "|".join(LANGUAGE_NAMES)
_EXPLICIT = (
    re.compile(rf"\btranslat\w*\b.{{0,200}}?\b(?:in|into|to)\s+({_NAMES})\b", re.I | re.S),
    re.compile(
        rf"\b(?:answer|respond|reply|write|say|output)\b[^.?!\n]{{0,60}}?\bin\s+({_NAMES})\b",
        re.I,
    ),
    re.compile(rf"\b({_NAMES})\s+translation\b", re.I),
)
_ANY_NAME = re.compile(rf"\b({_NAMES})\b", re.I)


def detect(text: str, *, min_hits: int = 3) -> str | None:
    """Language code of ``text``, or None when unsure."""
    text = _CODE.sub(" ", text)
    counts: dict[str, int] = {}
    latin = 0
    for ch in text:
        o = ord(ch)
        if o < 0x250:
            if ch.isalpha():
                latin += 1
            continue
        for code, lo, hi in _SCRIPTS:
            if lo <= o <= hi:
                counts[code] = counts.get(code, 0) + 1
                break
    if counts:
        code, n = max(counts.items(), key=lambda kv: kv[1])
        if code == "zh" and counts.get("ja", 0) > 0:
            code = "ja"  # kana next to kanji
        if n >= 4 and n > latin / 4:
            return code
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < 4:
        return None
    hits = {lang: sum(1 for w in words if w in stop) for lang, stop in _STOPWORDS.items()}
    ranked = sorted(hits.items(), key=lambda kv: kv[1], reverse=True)
    (best, best_hits), (_, second_hits) = ranked[0], ranked[1]
    if best_hits >= min_hits and best_hits >= 1.5 * second_hits + 1:
        return best
    return None


def expected_language(instructions: str, prompt: str) -> str | None:
    """The language the answer should be in, or None when it cannot be told."""
    for pattern in _EXPLICIT:
        match = pattern.search(instructions)
        if match:
            return LANGUAGE_NAMES[match.group(1).lower()]
    if _ANY_NAME.search(instructions):
        return None  # a language is named but not as the answer's: don't guess
    return detect(prompt)
