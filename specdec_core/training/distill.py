"""Self-distillation data: the target's own answers to a prompt set, its distributions over them, and the loss.

Trained drafters (a small draft model, an early exit, Medusa heads) learn to imitate the target, so the
best data is what the target itself says (Medusa-2's "self-distillation", Cai et al. 2024; the draft
distillation of DistillSpec, Zhou et al. 2024). Soft targets are the target's full next-token distribution
at every position, kept as its top-k log-probs plus the mass of the rest: the drafter is trained by KL to p
(`soft_ce`), not to p's argmax, so that acceptance min(1, p/q) holds up when sampling, not only when greedy.

The prompts are the hand-written `PROMPTS` below plus the template ones of prompts.py (`training_prompts`);
`HELDOUT` is never trained on. The trainers use greedy answers (temperature 0: exactly the contexts of the
greedy benchmark); `samples_info` can also sample at a temperature, which `train --temps 0,0.7` adds as a
second pass.

Everything is cached under runs/distill/ by a hash of (model, prompts, settings), so a second call is instant.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .prompts import expanded, more, third

CACHE_DIR = Path("runs/distill")

_LANGS = ["Python", "JavaScript", "Go", "Rust", "C", "Java", "TypeScript", "Ruby"]

# Written for this project; none of them is in the benchmark prompt files (a test checks).
PROMPTS: list[str] = [
    # code
    "Write a Python function that returns the factorial of n using recursion.",
    "Write a Python function `count_words(text)` that returns a dict mapping each word to its count.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function `flatten(lst)` that flattens a nested list of any depth.",
    "Write a Python function that returns the n-th triangular number.",
    "Write a Python class `Queue` backed by two stacks, with enqueue and dequeue.",
    "Write a Python function `binary_search(arr, target)` that returns the index or -1.",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a Python dataclass `Point` with x and y and a method `distance(other)`.",
    "Write a Python function that converts a temperature from Fahrenheit to Celsius.",
    "Write a Python generator that yields the squares of the numbers from 1 to n.",
    "Write a Python function that reads a text file and returns its longest line.",
    "Write a Python script that prints the numbers from 1 to 100, but prints Fizz for multiples of 3 and Buzz for multiples of 5.",
    "Write a Python function `chunk(lst, n)` that splits a list into pieces of size n.",
    "Write a Python function that returns the greatest common divisor of two integers.",
    "Write a Python function that sorts a list of dictionaries by the key 'age'.",
    "Write a Python decorator `timed` that prints how long a function call took.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a Python class `BankAccount` with deposit, withdraw and balance, refusing overdrafts.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function `transpose(matrix)` for a list of lists.",
    "Write a Python context manager that changes the working directory and restores it afterwards.",
    "Write a pytest test for a function `multiply(a, b)`.",
    "Write a Python function that returns the second largest number in a list.",
    "Write a Python function that parses a query string like 'a=1&b=2' into a dict.",
    "Write a JavaScript function that returns the maximum value in an array.",
    "Write a JavaScript function `debounce(fn, ms)`.",
    "Write a JavaScript function that capitalizes the first letter of every word in a string.",
    "Write a JavaScript async function that fetches JSON from a URL and logs it.",
    "Write a TypeScript interface for a blog post and a function that formats its title.",
    "Write a Go function that sums a slice of integers.",
    "Write a Rust function that returns the length of the longest word in a string slice.",
    "Write a C function that reverses an array of integers in place.",
    "Write a Java class `Rectangle` with width, height and an `area()` method.",
    "Write a Ruby method that returns the even numbers from an array.",
    "Write a SQL query that counts the orders per customer and shows only customers with more than 5 orders.",
    "Write a SQL statement that creates a table `products` with id, name, price and created_at.",
    "Write a SQL query that joins `employees` and `departments` and lists each employee with their department name.",
    "Write a bash script that backs up a directory into a dated tar.gz file.",
    "Write a bash one-liner that finds the 10 largest files under the current directory.",
    "Write a CSS rule that centers a div horizontally and vertically with flexbox.",
    "Write an HTML form with fields for name, email and message, and a submit button.",
    "Write a Dockerfile for a small Python web app that runs `app.py` on port 8000.",
    "Write a Makefile with targets build, test and clean for a C project.",
    "Write a regular expression that matches dates in the format YYYY-MM-DD and explain it.",
    "Explain what this code does: `squares = [x * x for x in range(10) if x % 2 == 0]`",
    "Fix the bug in this Python code: `def add(a, b): return a - b`",
    "Write a Python function that computes the moving average of a list with window size k.",
    "Write a Python function that checks whether two strings are anagrams.",
    "Write a Python function that returns a list of the prime numbers below n using the sieve of Eratosthenes.",
    # JSON and structured output
    "Return a JSON object describing a movie with title, director, year and a list of actors.",
    "Give a JSON array of four fruits, each with name, color and calories per 100 grams.",
    "Convert to JSON with keys name, job and country: Kenji is a chef from Osaka, Japan.",
    "Write a JSON object for a library member with id, name, email and a list of borrowed book ids.",
    "Return a JSON object for a flight: flight_number, origin, destination, departure_time, seats_left.",
    "Produce a JSON list of three tasks, each with id, title, done (a boolean) and priority.",
    "Write a JSON object describing a laptop: brand, model, ram_gb, storage_gb, price_usd.",
    "Return JSON with keys 'city', 'country' and 'population' for Berlin.",
    "Give a JSON object for a recipe with name, servings, ingredients (list of objects with item and amount) and steps.",
    "Write a package.json for a Node project named demo-app with an express dependency and a start script.",
    "Return a JSON object with the days of the week as keys and the number of letters in each as values.",
    "Produce a JSON object describing a student: name, grade, subjects (a list) and average_score.",
    "Write a JSON array of three countries with name, capital and continent.",
    "Return a JSON object for an HTTP error response with status, error and message fields.",
    "Give a JSON object describing a car: make, model, year, electric (boolean) and range_km.",
    "Convert this to JSON with keys title and due_date: Finish the report by 12 May.",
    "Return a JSON object for a hotel booking: guest, check_in, check_out, room_type, nights.",
    "Write a JSON configuration for a logger with level, format and a list of handlers.",
    "Produce a JSON object with keys 'sentiment' and 'confidence' for the review: 'I loved this phone!'",
    "Give a JSON list of the first five even numbers with their squares, as objects with n and square.",
    "Return a JSON object describing a song: title, artist, album, duration_seconds.",
    "Write a JSON object for a user profile with username, bio, followers and a nested settings object.",
    "Return JSON for a shopping cart with items (name, qty, unit_price) and a total.",
    "Write a YAML file for a GitHub Actions workflow that runs pytest on push.",
    "Produce a JSON object mapping three programming languages to the year they were created.",
    "Give a JSON array of two events with name, date, location and attendees.",
    "Return a JSON object describing a dog: name, breed, age, vaccinated.",
    "Write a JSON object for a weather forecast with city and a list of three days, each with day, high and low.",
    "Return a JSON object with the fields id, question, options (a list of four) and answer for a quiz question about the moon.",
    "Turn this into a JSON object: name Ana, age 28, hobbies reading and cycling.",
    "Write a CSV table with a header row for three employees with name, role and salary.",
    "Write a markdown table comparing three planets by diameter and number of moons.",
    "Return a JSON object describing a museum with name, city, opening_hours and ticket_price.",
    "Produce JSON for a to-do app state: user, lists (each with name and items).",
    "Return a JSON object with keys 'word', 'part_of_speech' and 'definition' for the word 'serene'.",
    # extraction and editing
    "Extract the names of the people from this sentence: Tom met Sara and Luis at the station on Monday.",
    "List the dates mentioned in: The project started on 4 January, paused on 20 March and ended on 1 July.",
    "Extract all numbers from this text: The box weighs 12 kg, costs 45 dollars and holds 3 items.",
    "Summarize in one sentence: The city council approved a new park on Elm Street. Construction starts next spring and will take eight months.",
    "From this email, extract the sender's request: Hi team, could you send me the sales figures for May by Thursday? Thanks, Priya.",
    "Rewrite this sentence in the passive voice: The cat chased the mouse.",
    "Correct the grammar: She don't like apples and he have two dog.",
    "Extract the ingredients from: Boil 2 cups of water, add 1 cup of rice and a pinch of salt, cook for 15 minutes.",
    "Translate to French: Good morning, how are you today?",
    "Translate to Spanish: The library opens at nine in the morning.",
    "Make this sentence more formal: Hey, can you get back to me about the thing soon?",
    "Extract the key facts from: Mount Everest is 8,849 metres high and lies on the border between Nepal and China.",
    "Which cities are mentioned in this text? We flew from Madrid to Rome, then took a train to Milan.",
    "Classify the sentiment of this review as positive, negative or neutral: The food was cold and the service slow.",
    "Shorten this to under ten words: We would like to inform you that the meeting has been moved to Wednesday afternoon.",
    "List the action items in: Anna will book the room. Ben sends the agenda. Carla prints the handouts.",
    "Extract the product name and price: The new SoundMax headphones cost 79 euros.",
    "Find the verbs in: The children ran, laughed and played in the garden.",
    "Rewrite as a bulleted list: We need milk, bread, eggs, cheese and apples.",
    "Paraphrase: The experiment failed because the samples were contaminated.",
    "What is the main idea of this paragraph? Regular exercise improves sleep, mood and heart health, and it lowers the risk of many diseases.",
    "Extract the phone number and the name: Call Mr. Olsen at 555-0134 before noon.",
    "Convert these notes into full sentences: meeting 3pm; budget approved; hire two engineers.",
    "Answer using only the text: The bakery opens at 7 and closes at 19. When does the bakery close?",
    "Extract the title and the author: 'Dune' was written by Frank Herbert and published in 1965.",
    # chat and knowledge
    "What is the difference between weather and climate?",
    "How do I make a cup of green tea?",
    "Give me three tips for learning a new language.",
    "What causes the seasons on Earth?",
    "Explain what a black hole is to a ten-year-old.",
    "What are the benefits of drinking water?",
    "How does a rainbow form?",
    "What is the tallest mountain in Africa?",
    "Explain recursion in simple terms.",
    "What is the difference between a list and a tuple in Python?",
    "How many continents are there and what are they?",
    "Give me a simple plan for a productive morning.",
    "What is machine learning?",
    "Why do cats purr?",
    "What is the capital of Canada?",
    "Explain how a bicycle stays upright.",
    "What are three good habits for a healthy sleep?",
    "Who painted the Mona Lisa?",
    "What is an API?",
    "How do vaccines work? Keep it short.",
    "What is the difference between a virus and a bacterium?",
    "Suggest three names for a pet goldfish.",
    "What does HTTP stand for and what is it used for?",
    "How can I save money on groceries?",
    "Explain what gravity is.",
    "What is the Pythagorean theorem?",
    "Give me a short workout I can do at home without equipment.",
    "Hello! How are you today?",
    "What is a good way to start learning to code?",
    "Explain the water cycle in a few sentences.",
    # creative
    "Write a short poem about a mountain at sunrise.",
    "Tell a short story about a dragon who is afraid of the dark.",
    "Write a haiku about the first snow.",
    "Describe a market in a fantasy city.",
    "Write a limerick about a cat who loves pizza.",
    "Invent a new holiday and describe how people celebrate it.",
    "Write a motivational quote about patience.",
    "Describe the sound of rain to someone who has never heard it.",
    "Write a short dialogue between a teacher and a curious student about the stars.",
    "Write a four-line poem about friendship.",
    "Tell a fable about an ant and a river, with a moral.",
    "Write a product description for a magic umbrella.",
    "Describe a sunset over the desert in three sentences.",
    "Write a short bedtime story about a sleepy owl.",
    "Write a tweet announcing the opening of a small bookshop.",
    "Write the first paragraph of a science fiction story set on Mars.",
    "Invent a superhero and describe their powers.",
    "Write a thank-you note to a neighbour who watered your plants.",
    "Write a riddle and give its answer.",
    "Describe a cozy cabin in the woods in winter.",
    "Write a short poem about coffee in the morning.",
    "Tell a two-paragraph story about a lost key that opens a secret door.",
    "Write a slogan for a bicycle repair shop.",
    "Write a short birthday message for a grandmother turning 80.",
    "Describe a robot's first day at school.",
]
PROMPTS += [f"Write a {lang} function that checks whether a number is even, with a short comment."
            for lang in _LANGS]

# Held out from training: the manifests' acceptance figures are measured on these.
HELDOUT: list[str] = [
    "Write a Python function `median(values)` that returns the median of a list of numbers.",
    "Write a Python function that returns the number of uppercase letters in a string.",
    "Write a JavaScript function that sums the numbers in an array.",
    "Write a SQL query that finds the three most expensive products.",
    "Return a JSON object describing a bicycle with brand, gears, color and price.",
    "Give a JSON array of three books, each with title and year.",
    "Return a JSON object for a concert: artist, venue, date, ticket_price.",
    "Convert to JSON with keys name and sport: Lena plays tennis.",
    "Extract the colors mentioned in: She wore a red scarf, a green coat and blue shoes.",
    "What is the largest ocean on Earth?",
    "Write a short poem about a train at night.",
    "Give me two tips for staying focused while studying.",
]


FRESH = Path(__file__).resolve().parents[2] / "docs" / "fresh-prompts.jsonl"


def bench_prompts() -> set[str]:
    """Every prompt of the benchmark files and of the fresh evaluation set (when present): never trained on."""
    from ..bench.workloads import PROMPT_DIR, load_jsonl
    files = sorted(PROMPT_DIR.glob("*.jsonl")) + ([FRESH] if FRESH.exists() else [])
    return {r["prompt"] for f in files for r in load_jsonl(f)}


def training_groups() -> list[list[str]]:
    """The training prompts in the groups they were added in, each group's answers cached apart: the
    hand-written prompts and the first templates, then prompts.more(), then prompts.third(); benchmark and
    held-out ones dropped, and any a group before it holds."""
    seen = set(HELDOUT) | bench_prompts()
    groups = [PROMPTS + expanded(exclude=set(PROMPTS) | seen)]
    for extra in (more(), third()):
        seen |= set(groups[-1])
        groups.append([p for p in dict.fromkeys(extra) if p not in seen])
    return groups


def training_prompts() -> list[str]:
    """Every training prompt, the groups in order."""
    return [p for g in training_groups() for p in g]


def _key(lm, **kw) -> str:
    blob = json.dumps({"model": lm.name, "dtype": str(lm.dtype), "vocab": lm.vocab_size, "layers": lm.num_layers, **kw}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _cached(path: Path, make):
    if path.exists():
        return torch.load(path, weights_only=False)
    out = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(out, tmp)
    tmp.replace(path)
    return out


def samples_info(lm, n_prompts=None, max_new_tokens=96, seed=0, batch_size=16, temperature=0.7,
                 prompts: list[str] | None = None) -> dict:
    """The target's own answers, as the whole cached record: seqs, prompt_lens, settings, seconds.

    Each seq is prompt ids (chat template) + answer ids (through eos if it stopped); prompt_lens says where
    each answer starts. temperature 0 is greedy; otherwise plain sampling at that temperature (no top-k/top-p),
    seeded. Batch size changes padding only; it is not part of the cache key."""
    prompts = list(PROMPTS if prompts is None else prompts)[:n_prompts]
    if not prompts:
        raise ValueError("no prompts to distil from")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    settings = dict(prompts=prompts, max_new_tokens=max_new_tokens, seed=seed, temperature=temperature)
    path = CACHE_DIR / f"samples-{_key(lm, **settings)}.pt"
    return _cached(path, lambda: _generate(lm, prompts, max_new_tokens, seed, batch_size, temperature))


@torch.inference_mode()
def _generate(lm, prompts, max_new_tokens, seed, batch_size, temperature) -> dict:
    t0 = time.perf_counter()
    enc = [lm.encode(p).tolist() for p in prompts]
    pad = lm.tokenizer.pad_token_id
    pad = pad if pad is not None else min(lm.eos_ids)
    eos = lm.eos_ids
    torch.manual_seed(seed)
    seqs = [None] * len(enc)
    # longest first, so each batch pads little
    order = sorted(range(len(enc)), key=lambda i: -len(enc[i]))
    bar = tqdm(total=len(enc), desc=f"target answers (T={temperature})", unit="prompt")
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        n = max(len(enc[i]) for i in idx)
        ids = torch.tensor([[pad] * (n - len(enc[i])) + enc[i] for i in idx])          # [B, n] left padded
        mask = torch.tensor([[0] * (n - len(enc[i])) + [1] * len(enc[i]) for i in idx])
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False)
        out = lm.model.generate(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                                max_new_tokens=max_new_tokens, pad_token_id=pad, **kw)
        for row, i in zip(out[:, n:].tolist(), idx):
            ans = []
            for t in row:
                ans.append(t)
                if t in eos:
                    break
            seqs[i] = enc[i] + ans
        bar.update(len(idx))
    bar.close()
    return dict(seqs=seqs, prompt_lens=[len(e) for e in enc], temperature=temperature, seed=seed,
                max_new_tokens=max_new_tokens, n_prompts=len(prompts),
                answer_tokens=sum(len(s) - len(e) for s, e in zip(seqs, enc)),
                seconds=time.perf_counter() - t0)


def target_dists(lm, seqs: list[list[int]], topk: int = 64, batch_size: int = 8) -> list[tuple]:
    """The target's next-token distributions over `seqs` as soft targets, cached.

    Returns, per sequence, (idx [n-1, topk] int32, logp [n-1, topk] float32): row t is the target's
    distribution for token t+1 given tokens[:t+1], kept as its top-k log-probs; the rest of the mass is
    1 - exp(logp).sum(-1) (see `soft_ce`)."""
    path = CACHE_DIR / f"dists-{_key(lm, seqs=seqs, topk=topk)}.pt"
    return _cached(path, lambda: _dists(lm, seqs, topk, batch_size))


@torch.inference_mode()
def _dists(lm, seqs, topk, batch_size):
    out = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for b in tqdm(range(0, len(order), batch_size), desc="target distributions", unit="batch"):
        idx = order[b:b + batch_size]
        n = max(len(seqs[i]) for i in idx)
        ids = torch.tensor([seqs[i] + [0] * (n - len(seqs[i])) for i in idx])  # right padded, masked by length
        mask = torch.tensor([[1] * len(seqs[i]) + [0] * (n - len(seqs[i])) for i in idx])
        logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device)).logits.float()
        logp = torch.log_softmax(logits, -1)                                       # [B, n, V]
        v, j = torch.topk(logp, topk, dim=-1)
        for r, i in enumerate(idx):
            m = len(seqs[i]) - 1
            out[i] = (j[r, :m].to(torch.int32).cpu(), v[r, :m].cpu())
    return out


def soft_ce(logq: torch.Tensor, idx: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of draft log-probs logq [N, V] against top-k targets (idx, logp [N, K]) plus the rest.

    Equals KL(p || q) up to p's entropy, with p's tail lumped into one bucket: -sum_top p log q
    - p_rest log q_rest. Entries with logp = -inf are dropped into the rest (a draft vocabulary that lacks
    them, drafters/vocab.py). Mean over rows."""
    p = logp.exp()                                                    # [N, K]; 0 where logp = -inf
    lq = logq.gather(-1, idx.long())                                  # [N, K]
    p_rest = (1 - p.sum(-1)).clamp_min(0)                             # [N]
    kept = torch.isfinite(logp)                                       # entries dropped by the caller own no q
    q_rest = (1 - (lq.exp() * kept).sum(-1)).clamp_min(1e-6)          # [N]
    return -((p * lq).sum(-1) + p_rest * q_rest.log()).mean()


def entropy_top(logp: torch.Tensor) -> float:
    """Mean entropy of the bucketed targets (top-k + rest): soft_ce minus this is KL(p || q)."""
    p = logp.exp()
    p_rest = (1 - p.sum(-1)).clamp_min(1e-9)
    return float(-((p * logp).sum(-1) + p_rest * p_rest.log()).mean())


def kl_top(logq: torch.Tensor, idx: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(p || q) with the same top-k + rest bucketing as `soft_ce` (a readable loss: 0 when q = p)."""
    return soft_ce(logq, idx, logp) - entropy_top(logp)
