"""A labelled set for the semantic cache: templated questions, each with paraphrases that must
hit and hard negatives that must not (another entity, another number, a negation), generated
from a seed so every run sees the same set.

A template has several phrasings of one question with the same slots; a question's meaning is
(template, polarity, slot values). The cache is seeded with one phrasing of each question; a
positive asks another phrasing (sometimes lower-cased, its punctuation dropped) of the same
meaning; a hard negative asks a phrasing of a meaning the cache does not hold, one slot or the
polarity away from a seeded one. Some slots are lower-case words ("miles", "pancakes"): the
guard cannot see those as names, so only the cosine and the learned thresholds refuse them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# template -> (phrasings, negated phrasings or (), {slot: values})
TEMPLATES: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict[str, tuple[str, ...]]]] = {
    "capital": (("What is the capital of {country}?", "what's the capital city of {country}", "Tell me the capital of {country}.",
                 "Which city is the capital of {country}?"), (),
                {"country": ("France", "Germany", "Spain", "Italy", "Japan", "Canada", "Brazil", "Kenya", "Peru", "Norway",
                             "Egypt", "India", "Chile", "Poland")}),
    "population": (("What is the population of {city}?", "How many people live in {city}?", "how many inhabitants does {city} have",
                    "Population of {city}?"), (),
                   {"city": ("Paris", "Berlin", "Madrid", "Rome", "Tokyo", "Toronto", "Lima", "Oslo", "Cairo", "Mumbai",
                             "Warsaw", "Nairobi", "Santiago", "Lyon")}),
    "author": (("Who wrote {book}?", "Who is the author of {book}?", "Tell me who wrote {book}.", "who wrote the book {book}"), (),
               {"book": ("Emma", "Dracula", "Hamlet", "Ulysses", "Frankenstein", "Persuasion", "Beloved", "Rebecca",
                         "Middlemarch", "Walden", "Lolita", "Dune", "Matilda", "Siddhartha")}),
    "convert": (("Convert {n} {unit} to {unit2}", "How many {unit2} is {n} {unit}?", "what is {n} {unit} in {unit2}",
                 "{n} {unit} in {unit2}, please"), (),
                {"n": ("5", "12", "40", "100", "250", "3", "75", "18", "60", "1000", "7", "33", "90", "15"),
                 "unit": ("miles",), "unit2": ("kilometers",)}),
    "sum": (("What is {a} plus {b}?", "What's {a} + {b}?", "Add {a} and {b}.", "calculate the sum of {a} and {b}"), (),
            {"a": ("2", "7", "13", "21", "48", "5", "9", "36", "64", "11", "17", "80", "3", "26"),
             "b": ("3", "8", "19", "4", "12", "6")}),
    "recipe": (("How do I make {dish}?", "What's a good recipe for {dish}?", "how to cook {dish}", "Give me a recipe for {dish}."), (),
               {"dish": ("pancakes", "lasagna", "risotto", "guacamole", "hummus", "paella", "brownies", "falafel", "omelettes",
                         "dumplings", "meatballs", "granola", "curry", "waffles")}),
    "translate": (("Translate 'good morning' into {language}", "How do you say 'good morning' in {language}?",
                   "What is 'good morning' in {language}?", "'good morning' in {language}, please"), (),
                  {"language": ("French", "German", "Spanish", "Italian", "Japanese", "Polish", "Swahili", "Hindi", "Dutch",
                                "Greek", "Turkish", "Korean", "Czech", "Finnish")}),
    "distance": (("How far is {city} from London?", "What is the distance between {city} and London?", "distance from {city} to London",
                  "How many kilometres separate {city} and London?"), (),
                 {"city": ("Paris", "Berlin", "Madrid", "Rome", "Dublin", "Oslo", "Vienna", "Prague", "Lisbon", "Athens",
                           "Zurich", "Brussels", "Warsaw", "Budapest")}),
    "worldcup": (("Who won the World Cup in {year}?", "Which country won the {year} World Cup?", "{year} World Cup winner?",
                  "who was the world cup champion in {year}"), (),
                 {"year": ("1966", "1970", "1974", "1978", "1982", "1986", "1990", "1994", "1998", "2002", "2006", "2010",
                           "2014", "2018")}),
    "define": (("What does {word} mean?", "Define {word}.", "What is the meaning of the word {word}?", "meaning of {word}"), (),
               {"word": ("serendipity", "ephemeral", "ubiquitous", "pragmatic", "eloquent", "resilient", "ambiguous", "candid",
                         "meticulous", "tenacious", "frugal", "lucid", "benevolent", "verbose")}),
    "safe": (("Is it safe to {act}?", "Can I safely {act}?", "is it ok to {act}", "Would it be safe to {act}?"),
             ("Is it not safe to {act}?", "Why can't I {act}?", "Is it never safe to {act}?", "Is it unsafe to {act}?"),
             {"act": ("swim after eating", "drink tap water in Lisbon", "fly while pregnant", "run with a cold", "eat raw eggs",
                      "charge a phone overnight", "take ibuprofen with coffee", "microwave plastic", "drive at night with glasses",
                      "freeze cooked rice", "lift weights every day", "use a laptop in bed", "sleep with a fan on", "fast for a day")}),
    "should": (("Should I {act} before bed?", "Is it a good idea to {act} before bed?", "should i {act} before going to sleep",
                "Do you recommend I {act} before bed?"),
               ("Should I not {act} before bed?", "Shouldn't I {act} before bed?", "Is it a bad idea not to {act} before bed?",
                "Should I never {act} before bed?"),
               {"act": ("drink milk", "read a book", "stretch", "eat fruit", "take a shower", "meditate", "drink tea",
                        "check my phone", "exercise", "write a journal", "drink water", "eat cheese", "listen to music", "take melatonin")}),
}


@dataclass(frozen=True)
class Pair:
    seed: str  # the question the cache holds
    query: str  # the question asked
    positive: bool  # whether `query` means what `seed` means
    kind: str  # "paraphrase" | "entity" | "number" | "negation"
    template: str
    seed_meaning: tuple[str, ...] = ()  # (template, polarity, the swapped slot's value)
    query_meaning: tuple[str, ...] = ()


def _fill(text: str, values: dict[str, str]) -> str:
    return text.format(**values)


def _noisy(text: str, rng: random.Random) -> str:
    """Other case and punctuation, as a user retypes a question."""
    choice = rng.random()
    if choice < 0.3:
        return text.lower()
    if choice < 0.5:
        return text.rstrip("?.!") + ("?" if not text.endswith("?") else "")
    return text


def generate(per_template: int = 14, seed: int = 41) -> list[Pair]:
    """For each template and each of its first `per_template` slot fills: two paraphrases of the
    seeded question, and two hard negatives (a swapped slot, or a negation where the template
    has one)."""
    rng = random.Random(seed)
    pairs: list[Pair] = []
    for name, (forms, negated, slots) in TEMPLATES.items():
        key_slot = max(slots, key=lambda s: len(slots[s]))  # the slot a negative swaps
        values = slots[key_slot]
        for i in range(min(per_template, len(values))):
            fill = {s: (v[i % len(v)] if s == key_slot else v[i % len(v)]) for s, v in slots.items()}
            fill[key_slot] = values[i]
            seed_form, *others = rng.sample(forms, len(forms))
            seeded = _fill(seed_form, fill)
            meaning = (name, "+", fill[key_slot])
            for other in others[:2]:
                pairs.append(Pair(seeded, _noisy(_fill(other, fill), rng), True, "paraphrase", name, meaning, meaning))
            swapped = dict(fill, **{key_slot: values[(i + 1 + rng.randrange(len(values) - 1)) % len(values)]})
            kind = "number" if values[0][:1].isdigit() else "entity"
            pairs.append(Pair(seeded, _noisy(_fill(rng.choice(forms), swapped), rng), False, kind, name, meaning,
                              (name, "+", swapped[key_slot])))
            if negated:
                pairs.append(Pair(seeded, _noisy(_fill(rng.choice(negated), fill), rng), False, "negation", name, meaning,
                                  (name, "-", fill[key_slot])))
            else:  # a second swap of another phrasing
                again = dict(fill, **{key_slot: values[(i + 2 + rng.randrange(len(values) - 2)) % len(values)]})
                if again[key_slot] != fill[key_slot]:
                    pairs.append(Pair(seeded, _noisy(_fill(rng.choice(others), again), rng), False, kind, name, meaning,
                                      (name, "+", again[key_slot])))
    return pairs
