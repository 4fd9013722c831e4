"""Seeded generator of the training task mix, rendered as ChatML conversations.

Every example is one user turn and one assistant turn:

    <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n

The tasks (weights in TASK_WEIGHTS are by example count; see train/README.md for the share of
tokens each takes):

  count   "Count from A to B, one number per line." with 1 <= A, B <= 1000 (and paraphrases);
          counting down ("Count down from B to A, ...") and by steps ("... in steps of S, ...").
          The answer is the numbers, one per line, then the end of the turn.
  needle  A haystack of generated sentences with one or several "The secret code is NNNNN."
          facts at random depths (several facts name their owner: "The secret code for the red
          box is NNNNN."), then the question. The answer repeats the fact.
  copy    "Repeat this list exactly, one item per line:" then 3..60 items; the answer is the list.
  lookup  Many "key: value" pairs, then "What is the value of KEY?"; the answer is the value.
  json    A JSON object, array, or array of objects built from given fields and values; the
          answer is compact one-line JSON (", " and ": " separators, as Python's json.dumps).
  prose   "Tell me a short story about ..." and similar; the answer is generated prose.

`Generator(seed).example()` returns (task, prompt, answer); `render_chat` makes the ChatML text.
The same seed gives the same stream on every machine (only Python's `random.Random` is used).
The canonical prompts (PROMPTS below) are the ones the probes and tests use.
"""

import json
import random
import re

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Canonical prompt texts (used verbatim by the model card's measurements and the probes).
PROMPTS = {
    "count": "Count from {a} to {b}, one number per line.",
    "count_down": "Count down from {a} to {b}, one number per line.",
    "count_step": "Count from {a} to {b} in steps of {s}, one number per line.",
    "needle_question": "What is the secret code?",
    "needle_question_named": "What is the secret code for the {owner}?",
    "copy": "Repeat this list exactly, one item per line:",
    "lookup": "What is the value of {key}?",
}


# The thinking mode: the chat template opens the block when a request turns thinking on
# (enable_thinking), the model writes a one-sentence plan (`thought`), closes the block and answers.
THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"


def thought(task, prompt, answer):
    """The short plan the model writes before its answer with thinking on: what it was asked,
    restated from the prompt (the numbers of a count, the question of a needle, the first and last
    items of a list, the key of a lookup, the fields of a JSON answer, the topic of prose)."""
    last = prompt.rstrip().split("\n")[-1]
    if task == "count":
        m = re.search(r"from (\d+) to (\d+)(?: in steps of (\d+))?", prompt)
        if m:
            a, b, s = m.groups()
            if "down" in prompt:
                return f"I count down from {a} to {b} and stop at {b}."
            if s:
                return f"I count from {a} to {b} in steps of {s}."
            return f"I count from {a} to {b} and stop at {b}."
    if task == "needle":
        m = re.search(r"secret code for the (.+)\?", last)
        return f"I look for the secret code for the {m.group(1)}." if m else \
            "I look for the secret code."
    if task == "copy":
        items = answer.split("\n")
        return f"I repeat the list exactly, from {items[0]} to {items[-1]}."
    if task == "lookup":
        m = re.search(r"value of (.+)\?", last)
        if m:
            return f"I look for the key {m.group(1)} in the pairs."
    if task == "json":
        try:
            value = json.loads(answer)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return f"I write a JSON object with the fields {', '.join(value)}."
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return f"I write a JSON array of objects with the fields {', '.join(value[0])}."
        if isinstance(value, list):
            return "I write a JSON array of the values in order."
    if task == "prose":
        for ask, plan in (("Tell me a short story about ", "I write a short story about "),
                          ("Write a few sentences about ", "I write a few sentences about "),
                          ("Describe a day in the life of ", "I describe a day in the life of "),
                          ("Write a short paragraph", "I write a short paragraph")):
            if prompt.startswith(ask):
                return plan + prompt[len(ask):].rstrip(".") + "."
    return "I answer the request."


def render_chat(prompt, answer=None):
    """ChatML for one user turn; with answer=None it ends with the assistant header
    (the generation prompt)."""
    text = f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"
    if answer is not None:
        text += f"{answer}{IM_END}\n"
    return text


# ----------------------------------------------------------------------------------------------
# Word lists for generated prose and task items.

NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack",
         "Kate", "Leo", "Mia", "Noah", "Olivia", "Paul", "Rosa", "Sam", "Tom", "Uma", "Vera",
         "Will", "Zoe", "Anna", "Ben", "Clara", "Dan", "Eva", "Lily", "Max"]
ANIMALS = ["fox", "cat", "dog", "bird", "horse", "rabbit", "owl", "bear", "mouse", "deer",
           "wolf", "duck", "frog", "goat", "lion", "fish", "sheep", "turtle"]
COLORS = ["red", "blue", "green", "yellow", "black", "white", "brown", "orange", "purple",
          "gray", "pink", "silver", "golden"]
OBJECTS = ["box", "door", "book", "key", "lamp", "chair", "table", "bag", "cup", "ball",
           "boat", "clock", "window", "bottle", "basket", "letter", "map", "coin", "ring",
           "bell", "car", "house", "garden", "bridge"]
PLACES = ["the forest", "the river", "the village", "the city", "the garden", "the market",
          "the hill", "the lake", "the school", "the park", "the beach", "the kitchen",
          "the library", "the farm", "the station", "the castle", "the valley", "the road"]
ADJECTIVES = ["small", "big", "old", "young", "quiet", "happy", "tired", "brave", "kind",
              "bright", "dark", "warm", "cold", "strange", "little", "busy", "gentle", "clever",
              "slow", "fast", "long", "soft", "heavy", "new"]
VERBS_PAST = ["walked to", "looked at", "ran past", "found", "opened", "carried", "watched",
              "painted", "cleaned", "visited", "followed", "picked up", "lost", "saw",
              "remembered", "closed", "fixed", "wanted", "liked", "moved"]
TIMES = ["In the morning", "At night", "One day", "Later", "After lunch", "In the evening",
         "Every day", "Before dinner", "On Sunday", "In the spring", "That winter",
         "Long ago", "Soon", "Then", "The next day"]
WEATHER = ["The sun was warm.", "It was raining.", "The wind was cold.", "The sky was clear.",
           "It was a quiet day.", "Snow covered the ground.", "The air smelled of rain.",
           "Clouds moved over the hills."]
FEELINGS = ["happy", "sad", "calm", "surprised", "glad", "curious", "sleepy", "proud",
            "worried", "excited"]
FRUITS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear",
          "plum", "melon", "kiwi", "lime", "berry", "fig", "date"]
CITIES = ["Paris", "London", "Berlin", "Rome", "Madrid", "Tokyo", "Oslo", "Vienna", "Prague",
          "Lisbon", "Dublin", "Athens", "Cairo", "Lima", "Seoul", "Boston"]
GREEK = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "sigma", "omega", "rho", "tau", "phi"]
FIELDS_STR = {"name": NAMES, "city": CITIES, "color": COLORS, "animal": ANIMALS,
              "fruit": FRUITS, "item": OBJECTS, "title": None, "country": None}
COUNTRIES = ["France", "Spain", "Italy", "Japan", "Peru", "Norway", "Egypt", "Chile", "Kenya",
             "Canada", "Brazil", "India"]


def _cap(s):
    return s[0].upper() + s[1:]


class Generator:
    """Deterministic stream of (task, prompt, answer) for a seed."""

    TASK_WEIGHTS = {"count": 0.30, "needle": 0.22, "copy": 0.12, "lookup": 0.10,
                    "json": 0.14, "prose": 0.12}
    # the B of a count_suffix example: three digits whose last two are not 00, or two digits
    # whose last is not 0 (so that B's last digits are a number of their own)
    SUFFIX_B3 = tuple(x for x in range(101, 1000) if x % 100)
    SUFFIX_B2 = tuple(x for x in range(11, 100) if x % 10)

    def __init__(self, seed, max_answer_tokens=1150, max_prompt_chars=4200, weights=None,
                 short_frac=0.0, count_short=0.0, json_style="quoted",
                 short_tasks=("needle", "copy", "lookup"), count_down=0.20, count_trap=0.0,
                 count_hops=0.0, json_rows=0.25, copy_near=0.0, json_wide=False,
                 count_suffix=0.0, rows_alike=0.0):
        self.rng = random.Random(seed)
        # share of counting-up examples drawn with a span of 1..40 from any start: each example
        # holds one start and one stop decision, so short counts give many of them per token
        self.count_short = count_short
        # "quoted": field names in the prompt are written as in the answer ("city" = "Oslo"),
        # so they tokenize the same in both and the answer copies tokens (the shipped model's
        # format). "plain" (city = "Oslo"): the first format; the tokenizer's vocabulary was
        # built from it (corpus_sample), so it stays for that stream.
        assert json_style in ("quoted", "plain")
        self.json_style = json_style
        self.weights = dict(weights or self.TASK_WEIGHTS)
        # share of needle / copy / lookup examples drawn short (a haystack of 100..600
        # characters, 3..12 items or pairs): attention over few tokens learns to find a
        # far-away token much faster than over a thousand
        self.short_frac = short_frac
        self.short_tasks = tuple(short_tasks)
        # share of counting examples that count down (the rest: 18 % by steps, the others up)
        self.count_down = count_down
        # share of counting-up examples drawn as "traps": B - A is 100..130 or 200..230, so a
        # number ending in B's last two digits (534 for B = 634) comes before B, and the stop
        # must compare the hundreds digit too (a model that compares only the last two stops
        # there: train/README.md, stage 8)
        self.count_trap = count_trap
        # share of counting examples drawn as short counts by 100, 50, 20 or 10 from any start
        # (334, 434, 534, 634): every line ends like B, so each line is a stop decision that only
        # the leading digits settle -- the trap of the counts by one, many times per example
        self.count_hops = count_hops
        # share of JSON examples that are arrays of objects (the rest: half objects, the others
        # arrays of values in proportion); their rows are where JSON fails most (train/README.md)
        self.json_rows = json_rows
        # share of copy lists whose items share two to four first parts (_near_pool)
        self.copy_near = copy_near
        # JSON answers longer than the held-out ones (objects of up to 8 fields, arrays of up to
        # 6 objects of up to 4 fields), so that the measured sizes sit inside the trained range
        # and not at its edge, where the row count and the field order failed most
        self.json_wide = json_wide
        # share of counting-up examples drawn so that a shorter number equal to B's last digits
        # comes before B (94 before 194, 4 before 14): a stop that compares the digits written
        # so far with B's last ones ends there (5 -> 194 stopped at 94)
        self.count_suffix = count_suffix
        # share of arrays of objects whose rows repeat values of earlier rows (each value, after
        # the first row, taken from an earlier row with probability one third): the next value
        # is then settled only by which row is being written, where arrays of objects fail
        self.rows_alike = rows_alike
        self.max_answer_tokens = max_answer_tokens
        self.max_prompt_chars = max_prompt_chars

    def _short(self, task):
        return (self.short_frac > 0 and task in self.short_tasks
                and self.rng.random() < self.short_frac)

    # -- prose ---------------------------------------------------------------------------------
    def sentence(self):
        r = self.rng
        k = r.randrange(10)
        name, animal, obj = r.choice(NAMES), r.choice(ANIMALS), r.choice(OBJECTS)
        adj, place, color = r.choice(ADJECTIVES), r.choice(PLACES), r.choice(COLORS)
        if k == 0:
            return f"{r.choice(TIMES)}, {name} {r.choice(VERBS_PAST)} the {adj} {obj}."
        if k == 1:
            return f"The {adj} {animal} lived near {place}."
        if k == 2:
            return f"{name} {r.choice(VERBS_PAST)} a {color} {obj} in {place}."
        if k == 3:
            return r.choice(WEATHER)
        if k == 4:
            return f"{name} felt {r.choice(FEELINGS)} and went to {place}."
        if k == 5:
            return f"There was a {adj} {obj} next to the {r.choice(OBJECTS)}."
        if k == 6:
            return f"The {animal} {r.choice(VERBS_PAST)} the {color} {obj}."
        if k == 7:
            return f"{name} and {r.choice(NAMES)} talked about the {adj} {animal}."
        if k == 8:
            return f"{_cap(place)} was {r.choice(ADJECTIVES)} and {r.choice(ADJECTIVES)}."
        return f"{r.choice(TIMES)}, the {animal} was {r.choice(FEELINGS)}."

    def paragraph(self, n_sentences):
        return " ".join(self.sentence() for _ in range(n_sentences))

    def prose(self):
        r = self.rng
        k = r.randrange(4)
        if k == 0:
            topic = f"a {r.choice(ADJECTIVES)} {r.choice(ANIMALS)}"
            prompt = f"Tell me a short story about {topic}."
        elif k == 1:
            prompt = f"Write a few sentences about {r.choice(PLACES)}."
        elif k == 2:
            prompt = f"Describe a day in the life of {r.choice(NAMES)}."
        else:
            prompt = "Write a short paragraph."
        n = r.randint(2, 12)
        paras = [self.paragraph(n)]
        if r.random() < 0.3:
            paras.append(self.paragraph(r.randint(2, 6)))
        return prompt, "\n\n".join(paras)

    # -- counting ------------------------------------------------------------------------------
    @staticmethod
    def _count_tokens(numbers):
        # one token per digit plus the newline (none after the last)
        return sum(len(str(n)) + 1 for n in numbers)

    def count(self):
        r = self.rng
        kind = r.random()
        budget = self.max_answer_tokens
        if self.count_hops > 0 and r.random() < self.count_hops:
            s = r.choice([100, 100, 50, 20, 10])
            n = r.randint(3, 10)
            a = r.randint(0, 1000 - s * (n - 1))
            nums = [a + s * i for i in range(n)]
            return PROMPTS["count_step"].format(a=nums[0], b=nums[-1], s=s), "\n".join(
                str(x) for x in nums)
        if kind < 0.82 - self.count_down:  # up by one
            if r.random() < 0.35:
                a = 1
            else:
                a = r.randint(1, 999)
            # lengths: mostly long (the bar counts to 300), some short
            span = int(r.choice([r.randint(1, 30), r.randint(20, 150), r.randint(100, 400),
                                 r.randint(250, 1000)]))
            if self.count_short > 0 and r.random() < self.count_short:
                a, span = r.randint(1, 999), r.randint(1, 40)
            if self.count_trap > 0 and r.random() < self.count_trap:
                span = r.choice([100, 100, 200]) + r.randint(0, 30)
                a = r.randint(1, 1000 - span)
            if self.count_suffix > 0 and r.random() < self.count_suffix:
                # B's last digits as a number of their own come first: A <= B mod 10^k
                if r.random() < 0.8:
                    b = r.choice(self.SUFFIX_B3)
                    tail = b % 100
                else:
                    b = r.choice(self.SUFFIX_B2)
                    tail = b % 10
                a = r.randint(1, tail)
                span = b - a
            b = min(1000, a + span)
            nums = list(range(a, b + 1))
            while self._count_tokens(nums) > budget:
                nums.pop()
            b = nums[-1]
            if a == b:
                b = a + 1
                nums = [a, b]
            prompt = self._count_prompt(a, b)
        elif kind < 0.82:  # down
            b = r.randint(1, 1000)
            span = int(r.choice([r.randint(1, 30), r.randint(20, 150), r.randint(100, 400)]))
            a = max(0 if r.random() < 0.1 else 1, b - span)
            nums = list(range(b, a - 1, -1))
            while self._count_tokens(nums) > budget:
                nums.pop()
            a = nums[-1]
            if a == b:
                a = max(0, b - 1)
                nums = [b, a] if a != b else [b]
            prompt = PROMPTS["count_down"].format(a=b, b=a)
        else:  # by steps
            s = r.choice([2, 2, 3, 5, 5, 10, 10, 25, 50, 100, 4, 7])
            a = r.choice([0, 1, s, r.randint(0, 500)])
            n = r.randint(3, 120)
            nums = [a + s * i for i in range(n) if a + s * i <= 1000]
            while self._count_tokens(nums) > budget:
                nums.pop()
            if len(nums) < 2:
                nums = [a, a + s]
            prompt = PROMPTS["count_step"].format(a=nums[0], b=nums[-1], s=s)
        return prompt, "\n".join(str(x) for x in nums)

    def _count_prompt(self, a, b):
        r = self.rng.random()
        if r < 0.85:
            return PROMPTS["count"].format(a=a, b=b)
        if r < 0.92:
            return f"Please count from {a} to {b}, one number per line."
        return f"List the numbers from {a} to {b}, one per line."

    # -- needle --------------------------------------------------------------------------------
    def needle(self):
        r = self.rng
        hi = max(400, self.max_prompt_chars - 300)
        target_chars = int(r.choice([r.randint(150, min(1200, hi)), r.randint(hi // 3, hi),
                                     r.randint(hi * 2 // 3, hi)]))
        if self._short("needle"):
            target_chars = r.randint(100, 600)
        sentences = []
        total = 0
        while total < target_chars:
            s = self.sentence()
            sentences.append(s)
            total += len(s) + 1
        n_facts = 1 if r.random() < 0.55 else r.randint(2, 5)
        codes = [r.randint(10000, 99999) for _ in range(n_facts)]
        if n_facts == 1:
            facts = [f"The secret code is {codes[0]}."]
            question = PROMPTS["needle_question"]
            answer = facts[0]
        else:
            owners = set()
            while len(owners) < n_facts:
                owners.add(f"{r.choice(COLORS)} {r.choice(OBJECTS)}")
            owners = sorted(owners)
            r.shuffle(owners)
            facts = [f"The secret code for the {o} is {c}." for o, c in zip(owners, codes)]
            k = r.randrange(n_facts)
            question = PROMPTS["needle_question_named"].format(owner=owners[k])
            answer = facts[k]
        for fact in facts:
            pos = r.randint(0, len(sentences))
            sentences.insert(pos, fact)
        haystack = " ".join(sentences)
        style = r.random()
        if style < 0.8:
            prompt = f"{haystack}\n\n{question}"
        else:
            prompt = f"Read the text and answer the question.\n\n{haystack}\n\n{question}"
        return prompt, answer

    # -- copy ----------------------------------------------------------------------------------
    def item(self, kind, pool=None):
        """One list item of a kind: 0 a word, 1 colour + object, 2 a number, 3 greek-number,
        4 a name, 5 name + number. With `pool`, the first part (colour, greek letter, name or
        the number's first two digits) comes from it instead."""
        r = self.rng
        if kind == 0:
            return r.choice(FRUITS + ANIMALS + OBJECTS + COLORS)
        if kind == 1:
            return f"{r.choice(pool or COLORS)} {r.choice(OBJECTS)}"
        if kind == 2:
            if pool:
                return f"{r.choice(pool)}{r.randint(0, 999):03d}"
            return str(r.randint(0, 99999))
        if kind == 3:
            return f"{r.choice(pool or GREEK)}-{r.randint(0, 999)}"
        if kind == 4:
            return r.choice(NAMES)
        return f"{r.choice(pool or NAMES)} {r.randint(1, 99)}"

    def _near_pool(self, kind):
        """Two to four first parts for a list of `kind` whose items look alike, so the next
        token of a copy is ambiguous from the last two tokens and only the line being copied
        settles it (the copy misses of train/README.md: 'Zoe 33' then 'Zoe 53')."""
        r = self.rng
        k = r.randint(2, 4)
        if kind == 2:
            return [str(x) for x in r.sample(range(10, 100), k)]
        return r.sample({1: COLORS, 3: GREEK, 5: NAMES}[kind], k)

    def copy(self):
        r = self.rng
        n = r.choice([r.randint(3, 20), r.randint(20, 60), r.randint(45, 60)])
        if self._short("copy"):
            n = r.randint(3, 12)
        if self.copy_near > 0 and r.random() < self.copy_near:
            kind = r.choice((1, 2, 3, 5))
            pool = self._near_pool(kind)
            items = [self.item(kind, pool) for _ in range(n)]
        else:
            mixed = r.random() < 0.3
            kind = r.randrange(6)
            items = [self.item(r.randrange(6) if mixed else kind) for _ in range(n)]
        body = "\n".join(items)
        return f"{PROMPTS['copy']}\n{body}", body

    # -- copy until a number ------------------------------------------------------------------
    def _near_miss(self, b):
        """A number that differs from b in one digit (most often the leading one) or by its
        leading digit dropped or added: 534, 624, 631, 34 or 1634 for 634."""
        r = self.rng
        d = str(b)
        while True:
            kind = r.random()
            if kind < 0.6 or len(d) == 1:
                i = 0 if kind < 0.4 else r.randrange(len(d))
                c = r.choice("123456789" if i == 0 else "0123456789")
                x = d[:i] + c + d[i + 1:]
            elif kind < 0.85:
                x = d[1:].lstrip("0") or d
            else:
                x = r.choice("123456789") + d
            if x != d and 0 < int(x) <= 9999:
                return int(x)

    def stop_copy(self):
        """"Repeat these numbers, one per line, stopping after B:" and a list holding B once,
        with near misses of B before and after it; the answer copies the list up to B. Copying
        makes every other token easy, so the loss is on the one thing counting's stop needs:
        ending the turn after a number equal to B in every digit, not after 534 for 634."""
        r = self.rng
        b = r.randint(1, 999) if r.random() < 0.8 else r.randint(1, 99)
        n = r.randint(4, 24)
        at = r.randint(0, n - 1)
        nums = []
        for i in range(n):
            if i == at:
                nums.append(b)
            elif r.random() < 0.6:
                nums.append(self._near_miss(b))
            else:
                x = r.randint(1, 999)
                nums.append(x if x != b else x + 1)
        body = "\n".join(str(x) for x in nums)
        answer = "\n".join(str(x) for x in nums[:at + 1])
        return f"Repeat these numbers, one per line, stopping after {b}:\n{body}", answer

    # -- key/value lookup ----------------------------------------------------------------------
    def lookup(self):
        r = self.rng
        n = r.choice([r.randint(3, 20), r.randint(20, 80)])
        if self._short("lookup"):
            n = r.randint(3, 12)
        keys = set()
        key_kind = r.randrange(3)
        while len(keys) < n:
            if key_kind == 0:
                keys.add(f"{r.choice(GREEK)}-{r.randint(0, 999)}")
            elif key_kind == 1:
                keys.add(f"{r.choice(COLORS)}-{r.choice(OBJECTS)}")
            else:
                keys.add(f"key{r.randint(0, 9999)}")
        keys = sorted(keys)
        r.shuffle(keys)
        val_kind = r.randrange(3)
        values = []
        for _ in keys:
            if val_kind == 0:
                values.append(str(r.randint(0, 99999)))
            elif val_kind == 1:
                values.append(r.choice(FRUITS + ANIMALS + CITIES))
            else:
                values.append(f"{r.choice(COLORS)}-{r.randint(0, 99)}")
        pairs = "\n".join(f"{k}: {v}" for k, v in zip(keys, values))
        q = r.randrange(n)
        prompt = f"Here are some pairs:\n{pairs}\n\n{PROMPTS['lookup'].format(key=keys[q])}"
        return prompt, values[q]

    # -- json ----------------------------------------------------------------------------------
    def _field_value(self, field):
        r = self.rng
        if field == "age":
            return r.randint(1, 99)
        if field in ("id", "count", "year", "price", "score"):
            return {"id": r.randint(1, 9999), "count": r.randint(0, 500),
                    "year": r.randint(1900, 2030), "price": r.randint(1, 999),
                    "score": r.randint(0, 100)}[field]
        if field in ("active", "done", "visible"):
            return r.random() < 0.5
        if field == "note":
            return None if r.random() < 0.5 else f"{r.choice(ADJECTIVES)} {r.choice(OBJECTS)}"
        if field == "country":
            return r.choice(COUNTRIES)
        if field == "title":
            return f"The {_cap(r.choice(ADJECTIVES))} {_cap(r.choice(ANIMALS))}"
        return r.choice(FIELDS_STR[field])

    ALL_FIELDS = ["name", "city", "color", "animal", "fruit", "item", "title", "country",
                  "age", "id", "count", "year", "price", "score", "active", "done", "visible",
                  "note"]

    @staticmethod
    def _spec(v):
        return json.dumps(v)

    def _field(self, f):
        return json.dumps(f) if self.json_style == "quoted" else f

    def json_task(self):
        r = self.rng
        kind = r.random()
        if self.json_rows != 0.25:  # objects and arrays keep their 2:1 ratio
            kind = 1.0 if kind >= 1.0 - self.json_rows else kind * 0.75 / (1.0 - self.json_rows)
        if kind < 0.5:
            fields = r.sample(self.ALL_FIELDS, r.randint(1, 8 if self.json_wide else 6))
            obj = {f: self._field_value(f) for f in fields}
            spec = ", ".join(f"{self._field(f)} = {self._spec(v)}" for f, v in obj.items())
            prompt = f"Write a JSON object with the fields {spec}."
            if r.random() < 0.3:
                prompt = f"Return only JSON. Make an object with {spec}."
            return prompt, json.dumps(obj)
        if kind < 0.75:
            n = r.randint(1, 12)
            k = r.randrange(3)
            if k == 0:
                items = [r.choice(FRUITS + ANIMALS + CITIES) for _ in range(n)]
            elif k == 1:
                items = [r.randint(0, 9999) for _ in range(n)]
            else:
                items = [self.item(r.randrange(6)) for _ in range(n)]
            spec = ", ".join(self._spec(x) for x in items)
            return f"Write a JSON array of these values: {spec}.", json.dumps(items)
        fields = r.sample(self.ALL_FIELDS, r.randint(1, 4 if self.json_wide else 3))
        n = r.randint(1, 6 if self.json_wide else 4)
        rows = [{f: self._field_value(f) for f in fields} for _ in range(n)]
        if self.rows_alike > 0 and r.random() < self.rows_alike:
            for i in range(1, n):
                for f in fields:
                    if r.random() < 1 / 3:
                        rows[i][f] = rows[r.randrange(i)][f]
        specs = "; ".join(", ".join(f"{self._field(f)} = {self._spec(v)}" for f, v in row.items())
                          for row in rows)
        prompt = f"Write a JSON array of {n} objects with these fields: {specs}."
        return prompt, json.dumps(rows)

    # -- mix -----------------------------------------------------------------------------------
    def example(self, task=None):
        if task is None:
            x = self.rng.random()
            for name, w in self.weights.items():
                task = name
                if x < w:
                    break
                x -= w
        fn = {"count": self.count, "needle": self.needle, "copy": self.copy,
              "lookup": self.lookup, "json": self.json_task, "prose": self.prose,
              "stopcopy": self.stop_copy}[task]
        prompt, answer = fn()
        return task, prompt, answer


def corpus_sample(seed, n):
    """Plain ChatML texts for building the tokenizer's vocabulary."""
    g = Generator(seed, json_style="plain")
    return [render_chat(p, a) for _, p, a in (g.example() for _ in range(n))]


if __name__ == "__main__":
    import sys
    g = Generator(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for task in ["count", "needle", "copy", "lookup", "json", "prose"]:
        _, p, a = g.example(task)
        print(f"===== {task}")
        text = render_chat(p, a)
        print(text if len(text) < 1500 else text[:700] + "\n[...]\n" + text[-500:])
        print(f"----- thinking: {THINK_OPEN}{thought(task, p, a)}{THINK_CLOSE}")
