"""More training prompts for self-distillation, built from templates (deterministic, offline).

The drafters learn from the target's own answers (distill.py), so more prompts means more of what the
target actually says. The hand-written `distill.PROMPTS` cover the five workloads in breadth; these add
volume where speculation is benchmarked hardest (code and structured output) and keep the other workloads
in proportion. None of them is a benchmark or held-out prompt (`expanded()` drops any that are, and a test
checks the benchmark files stay unseen).
"""
from __future__ import annotations

import itertools
import random

LANGS = ["Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C", "C++", "Ruby", "PHP", "Kotlin", "Swift"]

TASKS = [
    "returns the sum of the digits of an integer", "reverses the words in a sentence",
    "returns the largest of three numbers", "counts how many times a character appears in a string",
    "checks whether a year is a leap year", "converts a number of minutes into hours and minutes",
    "returns the average of a list of numbers", "finds the smallest element of an array",
    "removes all spaces from a string", "returns the last n elements of a list",
    "checks whether a list is sorted in ascending order", "computes the power of a number without a library call",
    "returns the index of the first negative number, or -1", "joins a list of strings with commas",
    "converts a string to title case", "returns the number of words in a sentence",
    "checks whether all characters in a string are digits", "computes the area of a circle from its radius",
    "returns the distance between two points", "swaps the first and last elements of an array",
    "rotates a list to the left by k positions", "returns the intersection of two lists",
    "counts the positive numbers in an array", "builds a multiplication table for n as a list of strings",
    "checks whether a number is a perfect square", "returns the median of three numbers",
    "converts Celsius to Fahrenheit", "capitalizes every other letter of a string",
    "returns the product of all numbers in a list", "computes the number of days between two dates",
    "replaces every vowel in a string with an asterisk", "checks whether a string contains only letters",
    "returns the cumulative sums of a list", "finds the most common element in a list",
    "truncates a string to n characters and adds an ellipsis", "converts a binary string to an integer",
    "returns all pairs in a list that add up to a target", "checks whether two lists have the same elements",
    "returns the n-th Fibonacci number iteratively", "removes the None values from a list",
    "computes a simple interest amount", "groups a list of words by their first letter",
    "checks whether a password is at least 8 characters long and contains a digit",
    "returns the longest common prefix of a list of strings", "counts the lines in a text",
    "clamps a number between a minimum and a maximum", "returns a list of the squares of the odd numbers",
    "converts a dictionary's keys to upper case", "returns the difference between the largest and smallest value",
]

CLASSES = [
    ("Stack of integers", "push, pop and size"), ("Counter", "increment, reset and value"),
    ("Temperature", "celsius and a fahrenheit property"), ("Book", "title, author and a describe method"),
    ("Circle", "radius, area and perimeter"), ("TodoList", "add, remove and list items"),
    ("Timer", "start, stop and elapsed"), ("Inventory", "add_item, remove_item and total_count"),
    ("Student", "name, grades and an average method"), ("Matrix2x2", "addition and a determinant"),
    ("LinkedList", "append, prepend and to_list"), ("ShoppingCart", "add, remove and total"),
]

SQL = [
    "selects all customers from the city 'Paris'", "counts the rows in a table `orders`",
    "finds the average salary per department", "deletes the users who never logged in",
    "updates the price of the product with id 7 to 19.99", "lists the ten most recent orders",
    "finds the employees hired in 2020", "returns the total sales per month",
    "selects the products whose name starts with 'A'", "finds duplicate email addresses in `users`",
    "creates a table `books` with id, title, author and year", "joins `orders` and `customers` on customer_id",
]

SHELL = [
    "prints the current date and the number of files in the current directory",
    "renames every .jpeg file in a folder to .jpg", "checks whether a file exists and prints a message",
    "loops over the numbers 1 to 5 and prints each", "counts the words in a file given as an argument",
    "deletes log files older than 7 days",
]

THINGS = [
    ("a person", "name, age, email and a list of hobbies"), ("a city", "name, country, population and landmarks"),
    ("a phone", "brand, model, storage_gb, price and colors"), ("a restaurant", "name, cuisine, rating and address"),
    ("a course", "code, title, credits and a list of prerequisites"), ("a tree", "species, height_m, age_years"),
    ("a podcast episode", "title, host, duration_minutes and guests"), ("a bank transaction",
                                                                          "id, amount, currency, date and type"),
    ("a planet", "name, diameter_km, moons and has_rings"), ("a video game", "title, genre, platforms and year"),
    ("a train", "number, origin, destination, departure and delay_minutes"),
    ("a house", "address, rooms, area_m2, price and for_sale"), ("a company", "name, founded, employees, ceo"),
    ("an invoice", "number, client, lines (each with description and amount) and total"),
    ("a sensor reading", "sensor_id, timestamp, temperature and humidity"),
    ("a cat", "name, color, age and indoor"), ("a board game", "name, min_players, max_players and minutes"),
    ("a job posting", "title, company, location, salary_range and skills"),
    ("a medication", "name, dose_mg, times_per_day and with_food"), ("a parking lot", "id, capacity, free_spots"),
    ("a coffee order", "size, drink, milk, sugar and price"), ("a mountain", "name, height_m, range, first_ascent"),
    ("a smartwatch", "brand, battery_days, water_resistant and sensors"),
    ("a festival", "name, city, start_date, end_date and headliners"),
    ("a server", "hostname, ip, cpu_cores, memory_gb and status"),
    ("an email", "from, to, subject, body and attachments"), ("a playlist", "name, owner and songs (title, artist)"),
    ("a gym membership", "member, plan, start_date and active"), ("a river", "name, length_km, countries"),
    ("an apartment listing", "city, rent, bedrooms, furnished and available_from"),
]

PHRASINGS = [
    "Return a JSON object describing {t} with {f}.",
    "Give me {t} as JSON with the keys {f}.",
    "Write a JSON object for {t}: {f}.",
]
LISTS = [
    "Give a JSON array of {n} {p}, each with {f}.",
]
PLURALS = [
    ("animals", "name, habitat and diet"), ("cities", "name and country"), ("colors", "name and hex"),
    ("movies", "title and year"), ("vegetables", "name and color"), ("languages", "name and speakers_millions"),
    ("sports", "name and players_per_team"), ("tools", "name and use"), ("rivers", "name and length_km"),
    ("inventors", "name and invention"), ("elements", "name, symbol and atomic_number"),
    ("desserts", "name and main_ingredient"),
]
PEOPLE = ["Ali", "Bea", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jonas", "Kofi", "Lucia"]
JOBS = ["nurse", "pilot", "teacher", "baker", "engineer", "lawyer", "farmer", "painter"]
PLACES = ["Oslo", "Lima", "Cairo", "Seoul", "Dublin", "Quito", "Hanoi", "Porto", "Accra", "Perth"]

TOPICS = ["the ocean at night", "an old lighthouse", "a busy train station", "autumn leaves", "a lost kitten",
          "a robot gardener", "the first day of spring", "a quiet library", "a thunderstorm", "a city bridge",
          "a paper boat", "the northern lights", "a village bakery", "a snowy owl", "a desert well",
          "a kite festival", "a forgotten violin", "a space station", "a fox in the snow", "a summer market"]
QUESTIONS = ["What is {x}?", "Explain {x} in two sentences.", "Why is {x} important?"]
CONCEPTS = ["photosynthesis", "inflation", "a compiler", "the immune system", "an ecosystem", "a database index",
            "democracy", "electricity", "the internet", "a leap year", "a volcano", "compound interest",
            "a hash function", "the moon's phases", "evaporation", "a neural network", "friction", "DNA",
            "a budget", "a time zone"]
FACTS = [
    "The museum opens at 10, closes at 18 and charges 12 euros for adults.",
    "Our team of six will meet in Room 4 on Friday at 2 pm to plan the launch.",
    "The river Nile is about 6,650 km long and flows through eleven countries.",
    "Order 4471 shipped on 3 March from Rotterdam and arrives on 9 March in Austin.",
    "The new library has 120,000 books, 40 computers and a cafe on the ground floor.",
    "Jana Novak, 41, is a dentist in Brno and has two children, Petr and Eva.",
    "The laptop weighs 1.3 kg, has 16 GB of memory and a battery that lasts 14 hours.",
    "The concert by the Blue Notes starts at 8 pm at the Harbour Hall; tickets cost 35 dollars.",
]
EXTRACTS = ["Extract the numbers from this text: {s}", "List the names and places mentioned in: {s}",
            "Summarize in one sentence: {s}", "Convert this text to JSON: {s}",
            "Extract the key facts as a bulleted list: {s}"]


def _code() -> list[str]:
    out = [f"Write a {lang} function that {task}." for lang, task in itertools.product(LANGS[:6], TASKS)]
    out += [f"Write a {lang} function that {task}." for lang, task in zip(itertools.cycle(LANGS[6:]), TASKS)]
    out += [f"Write a Python class `{name.split()[0]}` with {what}." for name, what in CLASSES]
    out += [f"Write a JavaScript class `{name.split()[0]}` with {what}." for name, what in CLASSES]
    out += [f"Write a SQL query that {q}." for q in SQL]
    out += [f"Write a bash script that {s}." for s in SHELL]
    out += [f"Write a Python function that {task}, with type hints and a docstring." for task in TASKS[::2]]
    return out


def _json() -> list[str]:
    out = [p.format(t=t, f=f) for (t, f), p in itertools.product(THINGS, PHRASINGS)]
    out += [LISTS[0].format(n=n, p=p, f=f) for (p, f), n in zip(PLURALS, itertools.cycle(["two", "three", "four"]))]
    rng = random.Random(0)
    for name in PEOPLE:
        job, place, age = rng.choice(JOBS), rng.choice(PLACES), rng.randint(21, 70)
        out.append(f"Convert to JSON with keys name, age, job and city: {name} is a {age}-year-old {job} in {place}.")
        out.append(f"Turn this into a JSON object: {name}, {job}, lives in {place}, age {age}.")
    out += [f"Write a YAML file describing {t} with {f}." for t, f in THINGS[:8]]
    return out


def _other() -> list[str]:
    out = [q.format(x=x) for x, q in zip(CONCEPTS, itertools.cycle(QUESTIONS))]
    out += [f"Write a short poem about {t}." for t in TOPICS[:10]]
    out += [f"Tell a short story about {t}." for t in TOPICS[10:]]
    out += [e.format(s=s) for s, e in zip(FACTS * 2, itertools.cycle(EXTRACTS))]
    return out


def expanded(exclude: set[str] = frozenset()) -> list[str]:
    """All template prompts in a fixed order, minus any in `exclude` (benchmark and held-out prompts)."""
    seen, out = set(exclude), []
    for p in _code() + _json() + _other():
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
