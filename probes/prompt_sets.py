"""Built-in prompt sets of real text, written for perfdiag, so a real model's workload has
natural prompts (and natural output lengths: requests end on the model's EOS).

Each entry is one user message; the target renders it with the model's chat template
(engine_ref's GGUF tokenizer), or sends it as is to a model without one. A workload names
a set with `prompts: NAME`; requests draw prompts in a seeded order.
"""

from __future__ import annotations

from ..errors import ConfigError

CHAT = (
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about autumn leaves.",
    "Give me three tips for getting better sleep.",
    "What is the difference between weather and climate?",
    "Translate 'Good morning, how are you?' into Spanish.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "How do I boil an egg so that the yolk stays soft?",
    "What are the main causes of inflation?",
    "Write a short thank-you note to a colleague who helped me move house.",
    "Why do cats purr?",
    "List five fruits that are high in vitamin C.",
    "What is photosynthesis?",
    "Suggest a name for a small bakery by the sea.",
    "How many planets are in the solar system, and which is the largest?",
    "Explain what a black hole is to a ten-year-old.",
    "What should I pack for a weekend hiking trip?",
    "Write a limerick about a forgetful robot.",
    "What is the Pythagorean theorem?",
    "Give me a simple recipe for tomato soup.",
    "Who wrote Pride and Prejudice, and what is it about?",
    "How does a refrigerator keep food cold?",
    "What are some good habits for learning a new language?",
    "Describe the water cycle in a few steps.",
    "Why is exercise good for mental health?",
    "Write a two-line poem about the moon.",
    "What is the difference between a virus and a bacterium?",
    "How do I write a polite email declining a meeting invitation?",
    "What is machine learning, in plain words?",
    "Name three famous paintings and their painters.",
    "What causes the seasons on Earth?",
    "Give me an idea for a birthday present for my grandmother.",
)

CODE = (
    "Write a Python function that reverses a string.",
    "How do I read a text file line by line in Python?",
    "Explain what a for loop does, with a short example.",
    "Write a Python function that checks whether a number is prime.",
    "What is the difference between a list and a tuple in Python?",
    "Write a SQL query that counts the rows of a table named orders.",
    "How do I sort a list of dictionaries by a key in Python?",
    "What does the HTTP status code 404 mean?",
    "Write a function that returns the largest number in a list.",
    "Explain recursion with a simple example.",
    "How do I create a virtual environment in Python?",
    "What is a Git branch, and how do I create one?",
)

PROMPT_SETS: dict[str, tuple[str, ...]] = {"chat": CHAT, "code": CODE, "mixed": CHAT + CODE}


def prompt_set(name: str) -> tuple[str, ...]:
    if name not in PROMPT_SETS:
        raise ConfigError(f"unknown prompt set {name!r}; built-ins: {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[name]
