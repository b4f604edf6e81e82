"""Which passwords a person may choose for the review inbox: at least 12 characters, and none
that a guesser tries first.

`password_problem` is the one rule, checked by `LoginsRepository.set_password`, which every way of
setting a password goes through (`kbflow users set-password`, the inbox's password page). It
refuses, besides a length outside 12…1024:

- the user id, or a password that contains it (for ids of three characters or more);
- one character or one short run repeated (``aaaaaaaaaaaa``, ``abcabcabcabc``), or fewer than
  five different characters;
- a sequence of the alphabet, the digits or a keyboard row (``1234567890ab``, ``qwertyuiop12``);
- a common password, or one with digits and symbols around it (``password1234``), or a few
  letters swapped for look-alikes (``p@ssw0rd2024!``): `COMMON` holds the most-used passwords
  and words of the public leaked-password lists (no dependency: zxcvbn is not installed here).
"""

from __future__ import annotations

import re

PASSWORD_MIN = 12
PASSWORD_MAX = 1024  # argon2 hashes anything; a cap keeps a login request cheap to refuse

_COMMON_WORDS = """
    password passw0rd passwort motdepasse contrasena senha wachtwoord salasana haslo parola
    letmein welcome welcomehome iloveyou loveyou trustno1 trustnoone whatever nothing secret
    topsecret mysecret mypassword yourpassword newpassword oldpassword changeme changeit
    changethis default admin administrator root superuser superman batman spiderman ironman
    qwerty qwertyuiop qwertz azerty asdfgh asdfghjkl zxcvbn zxcvbnm qazwsx qazwsxedc 1qaz2wsx
    1q2w3e4r 1q2w3e4r5t zaq12wsx abc123 abcd1234 a1b2c3d4 monkey dragon master shadow sunshine
    princess football baseball basketball soccer hockey michael jennifer jordan hunter ranger
    buster thomas tigger charlie robert daniel andrew matthew jessica ashley amanda michelle
    starwars pokemon minecraft fortnite computer internet samsung iphone google facebook
    linkedin twitter instagram youtube microsoft windows apple login access letmeinnow
    freedom liberty summer winter spring autumn flower cookie chocolate banana orange
    cheese pepper ginger purple silver golden diamond blessed jesus christ heaven angel
    lovely loveme family friends forever together beautiful hello hellothere helloworld
    goodbye thankyou please opensesame sesame password password1 password12 password123
    passwordpassword mypasswordis thisismypassword thisisapassword correcthorsebatterystaple
    correcthorse horsebattery letmeinplease iloveyouforever ihateyou fuckyou fuckoff
    killer soldier warrior wizard merlin matrix neo hacker hackme test tester testing
    testtest test1234 guest guestuser user username useruser demo demodemo sample example
    temp temporary temppassword company business office manager support service
    kbflow review reviewer inbox prefect qdrant postgres postgresql mysql oracle database
    january february march april may june july august september october november december
    monday tuesday wednesday thursday friday saturday sunday
"""
COMMON = frozenset(_COMMON_WORDS.split())
"""Common passwords and the words they are made of, lower case, letters only where possible."""

_SEQUENCES = (
    "abcdefghijklmnopqrstuvwxyz",
    "01234567890",
    "qwertyuiopasdfghjklzxcvbnm",
    "qwertzuiopasdfghjklyxcvbnm",
    "azertyuiopqsdfghjklmwxcvbn",
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik9ol0p",
)
_LOOK_ALIKES = str.maketrans("@40!13$57+89", "aaoiiessttbg")  # p@ssw0rd reads as password


def password_problem(user_id: str, password: str) -> str | None:
    """Why ``password`` may not be ``user_id``'s password (None: it may).

    >>> password_problem("amy", "password12")
    'a password needs at least 12 characters'
    >>> password_problem("amy", "correct horse battery") is None
    True
    """
    if len(password) < PASSWORD_MIN:
        return f"a password needs at least {PASSWORD_MIN} characters"
    if len(password) > PASSWORD_MAX:
        return f"a password has at most {PASSWORD_MAX} characters"
    lowered = password.lower()
    uid = user_id.strip().lower()
    if lowered.strip() == uid or (len(uid) >= 3 and uid in lowered):
        return "a password may not be or contain the user id"
    if len(set(lowered)) < 5 or _repeats(lowered):
        return "a password may not repeat a few characters: choose a few unrelated words"
    if _is_sequence(lowered):
        return "a password may not be a sequence of letters, digits or keys on the keyboard"
    if _is_common(lowered):
        return (
            "that password is one of the most common ones, which guessers try first: "
            "choose a few unrelated words"
        )
    return None


def _repeats(text: str) -> bool:
    """One run of up to a third of ``text`` repeated to fill it (``abcabcabcabc``)."""
    for size in range(1, len(text) // 3 + 1):
        unit = text[:size]
        if (unit * (len(text) // size + 1))[: len(text)] == text:
            return True
    return False


def _is_sequence(text: str) -> bool:
    """``text`` without its separators is a run along the alphabet, the digits or a keyboard
    row (forwards or backwards), or two such runs end to end."""
    core = re.sub(r"[\s\-_.]", "", text)
    return any(_runs(core, seq) <= 2 for seq in _SEQUENCES)


def _runs(text: str, seq: str) -> int:
    """How many runs of ``seq`` (either direction) ``text`` is cut into; a large number when a
    character is not in ``seq``."""
    runs, i = 0, 0
    while i < len(text):
        best = 0
        for order in (seq, seq[::-1]):
            start = order.find(text[i])
            if start < 0:
                continue
            n = 0
            while i + n < len(text) and start + n < len(order) and order[start + n] == text[i + n]:
                n += 1
            best = max(best, n)
        if best < 2:  # a single character is no run
            return len(text)
        runs, i = runs + 1, i + best
    return runs


def _is_common(text: str) -> bool:
    """``text`` is a common password, or one of its words with digits and symbols around it,
    with look-alike characters read as letters, or a common word repeated."""
    squeezed = re.sub(r"[\s\-_.]", "", text)
    trimmed = _letters(squeezed)
    for candidate in {squeezed, trimmed, squeezed.translate(_LOOK_ALIKES)}:
        letters = _letters(candidate.translate(_LOOK_ALIKES))
        if candidate in COMMON or letters in COMMON:
            return True
        for word in COMMON:  # a common word repeated, with digits or symbols around it
            if len(word) >= 4 and letters and not letters.replace(word, ""):
                return True
    return False


def _letters(text: str) -> str:
    """``text`` without the digits and symbols at its ends."""
    return re.sub(r"^[^a-z]+|[^a-z]+$", "", text)
