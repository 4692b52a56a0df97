"""Database, tasks and expert of the text_to_sql scenario.

`build_database(path)` writes the small company database deterministically (seeded RNG, fixed name
lists); the result is shipped as `text_to_sql.sqlite`. `write_tasks(path)` writes
`text_to_sql_tasks.jsonl` from `QUESTIONS` (question -> reference query). Rebuild both with

    .venv/bin/python scenarios/text_to_sql_lib.py

The expert answers with the task's reference query.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATABASE = HERE / "text_to_sql.sqlite"
TASKS = HERE / "text_to_sql_tasks.jsonl"

SCHEMA = """
CREATE TABLE departments (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL,
    budget INTEGER NOT NULL
);
CREATE TABLE employees (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    department_id INTEGER NOT NULL REFERENCES departments(id),
    title TEXT NOT NULL,
    salary INTEGER NOT NULL,
    hire_year INTEGER NOT NULL
);
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    country TEXT NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    category TEXT NOT NULL,
    price REAL NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    product_id INTEGER NOT NULL REFERENCES products(id),
    employee_id INTEGER NOT NULL REFERENCES employees(id),
    quantity INTEGER NOT NULL,
    order_date TEXT NOT NULL,
    status TEXT NOT NULL
);
"""

DEPARTMENTS = [("Engineering", "Berlin", 900000), ("Sales", "Paris", 450000), ("Marketing", "Paris", 300000),
               ("Finance", "London", 250000), ("Support", "Lisbon", 180000), ("Research", "Berlin", 600000),
               ("Legal", "London", 150000)]
TITLES = {"Engineering": ["Engineer", "Senior Engineer", "Manager"], "Sales": ["Sales Rep", "Account Manager", "Manager"],
          "Marketing": ["Marketer", "Designer", "Manager"], "Finance": ["Analyst", "Accountant", "Manager"],
          "Support": ["Agent", "Senior Agent", "Manager"], "Research": ["Scientist", "Senior Scientist", "Manager"],
          "Legal": ["Counsel", "Paralegal", "Manager"]}
FIRST = ["Ada", "Ben", "Chloe", "Dan", "Eva", "Finn", "Gina", "Hugo", "Iris", "Jon", "Kim", "Leo", "Mia", "Noah",
         "Olga", "Paul", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor", "Wen", "Xavi", "Yara", "Zoe"]
LAST = ["Smith", "Garcia", "Muller", "Rossi", "Silva", "Novak", "Berg", "Costa", "Dubois", "Khan", "Lee", "Moreau"]
COUNTRIES = ["France", "Germany", "Spain", "Italy", "Portugal", "UK", "USA", "Japan"]
COMPANIES = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Stark", "Wayne", "Tyrell", "Cyberdyne",
             "Soylent", "Aperture", "Wonka", "Gringotts", "Oscorp", "Pied Piper", "Dunder", "Nakatomi", "Monarch",
             "Prestige", "Zorg", "Bluth", "Sterling", "Krusty", "Massive"]
PRODUCTS = [("Laptop", "Hardware", 1200.0), ("Monitor", "Hardware", 300.0), ("Keyboard", "Hardware", 45.5),
            ("Mouse", "Hardware", 19.9), ("Docking Station", "Hardware", 180.0), ("Office Suite", "Software", 99.0),
            ("Antivirus", "Software", 39.0), ("Database License", "Software", 850.0), ("IDE License", "Software", 149.0),
            ("Setup Service", "Services", 250.0), ("Training Day", "Services", 600.0),
            ("Support Plan", "Services", 400.0), ("Cloud Storage", "Cloud", 12.5), ("Cloud VM", "Cloud", 75.0),
            ("Backup Plan", "Cloud", 25.0)]
STATUSES = ["shipped", "shipped", "shipped", "delivered", "delivered", "pending", "cancelled"]


def build_database(path: str | Path = DATABASE, seed: int = 7) -> Path:
    """Write the database to `path` (replacing it); the content depends only on `seed`."""
    path = Path(path)
    path.unlink(missing_ok=True)
    rng = random.Random(seed)
    connection = sqlite3.connect(str(path))
    try:
        connection.executescript(SCHEMA)
        connection.executemany("INSERT INTO departments VALUES (?, ?, ?, ?)",
                               [(i + 1, *row) for i, row in enumerate(DEPARTMENTS)])
        employees, names = [], set()
        while len(employees) < 60:
            name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            if name in names:
                continue
            names.add(name)
            department = rng.randrange(len(DEPARTMENTS))
            title = rng.choice(TITLES[DEPARTMENTS[department][0]][:2]) if len(employees) >= len(DEPARTMENTS) \
                else "Manager"
            department = department if len(employees) >= len(DEPARTMENTS) else len(employees)
            salary = rng.randrange(32, 130) * 1000 + (20000 if title == "Manager" else 0)
            employees.append((len(employees) + 1, name, department + 1, title, salary, rng.randint(2012, 2024)))
        connection.executemany("INSERT INTO employees VALUES (?, ?, ?, ?, ?, ?)", employees)
        customers = [(i + 1, company, rng.choice(COUNTRIES)) for i, company in enumerate(COMPANIES)]
        connection.executemany("INSERT INTO customers VALUES (?, ?, ?)", customers)
        connection.executemany("INSERT INTO products VALUES (?, ?, ?, ?)",
                               [(i + 1, *row) for i, row in enumerate(PRODUCTS)])
        sellers = [e[0] for e in employees if e[2] == 2] + [e[0] for e in employees if e[2] == 5][:2]
        orders = []
        for index in range(150):
            month, day = rng.randint(1, 12), rng.randint(1, 28)
            orders.append((index + 1, rng.randint(1, len(customers) - 2), rng.randint(1, len(PRODUCTS) - 2),
                           rng.choice(sellers), rng.choice([1, 1, 1, 2, 2, 3, 5, 10]),
                           f"{rng.choice([2023, 2024])}-{month:02d}-{day:02d}", rng.choice(STATUSES)))
        connection.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)", orders)
        connection.commit()
        connection.execute("VACUUM")
    finally:
        connection.close()
    return path


# question -> reference query (SQLite). Rows are compared as multisets; column names do not matter.
QUESTIONS: list[tuple[str, str]] = [
    ("How many employees are there?", "SELECT COUNT(*) FROM employees"),
    ("List the names of all departments located in Berlin.",
     "SELECT name FROM departments WHERE city = 'Berlin'"),
    ("What is the average salary of all employees?", "SELECT AVG(salary) FROM employees"),
    ("List the names of employees who earn more than 100000.",
     "SELECT name FROM employees WHERE salary > 100000"),
    ("How many employees does each department have? Give the department name and the count.",
     "SELECT d.name, COUNT(e.id) FROM departments d LEFT JOIN employees e ON e.department_id = d.id "
     "GROUP BY d.id, d.name"),
    ("What is the highest salary in the Engineering department?",
     "SELECT MAX(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id "
     "WHERE d.name = 'Engineering'"),
    ("List the names of the managers (employees whose title is Manager).",
     "SELECT name FROM employees WHERE title = 'Manager'"),
    ("Which employees were hired in 2020 or later? Give their names.",
     "SELECT name FROM employees WHERE hire_year >= 2020"),
    ("What is the total budget of all departments?", "SELECT SUM(budget) FROM departments"),
    ("Give the name of each department and the average salary of its employees.",
     "SELECT d.name, AVG(e.salary) FROM departments d JOIN employees e ON e.department_id = d.id "
     "GROUP BY d.id, d.name"),
    ("Which departments have more than 8 employees? Give their names.",
     "SELECT d.name FROM departments d JOIN employees e ON e.department_id = d.id GROUP BY d.id, d.name "
     "HAVING COUNT(*) > 8"),
    ("List the names of employees who work in a department located in Paris.",
     "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.city = 'Paris'"),
    ("How many orders are there?", "SELECT COUNT(*) FROM orders"),
    ("How many orders have the status 'pending'?", "SELECT COUNT(*) FROM orders WHERE status = 'pending'"),
    ("How many orders are there for each status? Give the status and the count.",
     "SELECT status, COUNT(*) FROM orders GROUP BY status"),
    ("List the names of the products in the Hardware category.",
     "SELECT name FROM products WHERE category = 'Hardware'"),
    ("What is the average price of products in each category? Give the category and the average price.",
     "SELECT category, AVG(price) FROM products GROUP BY category"),
    ("Which products cost more than 200? Give their names and prices.",
     "SELECT name, price FROM products WHERE price > 200"),
    ("How many customers are there in each country? Give the country and the count.",
     "SELECT country, COUNT(*) FROM customers GROUP BY country"),
    ("List the names of the customers from Germany.", "SELECT name FROM customers WHERE country = 'Germany'"),
    ("What is the total quantity ordered of each product? Give the product name and the total quantity.",
     "SELECT p.name, SUM(o.quantity) FROM orders o JOIN products p ON o.product_id = p.id GROUP BY p.id, p.name"),
    ("What is the total revenue (quantity times price) of all orders that were not cancelled?",
     "SELECT SUM(o.quantity * p.price) FROM orders o JOIN products p ON o.product_id = p.id "
     "WHERE o.status != 'cancelled'"),
    ("How many orders did each customer place? Give the customer name and the number of orders, for customers "
     "with at least one order.",
     "SELECT c.name, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.id, c.name"),
    ("Which customers have never placed an order? Give their names.",
     "SELECT name FROM customers WHERE id NOT IN (SELECT customer_id FROM orders)"),
    ("Which products have never been ordered? Give their names.",
     "SELECT name FROM products WHERE id NOT IN (SELECT product_id FROM orders)"),
    ("How many orders were placed in 2024?", "SELECT COUNT(*) FROM orders WHERE order_date LIKE '2024-%'"),
    ("How many orders were placed in each month of 2023? Give the month number (1-12) and the count.",
     "SELECT CAST(strftime('%m', order_date) AS INTEGER), COUNT(*) FROM orders "
     "WHERE order_date LIKE '2023-%' GROUP BY strftime('%m', order_date)"),
    ("For each employee who handled at least one order, give the employee name and the number of orders "
     "handled.",
     "SELECT e.name, COUNT(*) FROM orders o JOIN employees e ON o.employee_id = e.id GROUP BY e.id, e.name"),
    ("Which employee(s) have the highest salary? Give the name(s).",
     "SELECT name FROM employees WHERE salary = (SELECT MAX(salary) FROM employees)"),
    ("Which product(s) are the cheapest? Give the name(s) and the price.",
     "SELECT name, price FROM products WHERE price = (SELECT MIN(price) FROM products)"),
    ("List the names of employees who earn more than the average salary of all employees.",
     "SELECT name FROM employees WHERE salary > (SELECT AVG(salary) FROM employees)"),
    ("What is the total salary cost of each department? Give the department name and the sum of salaries.",
     "SELECT d.name, SUM(e.salary) FROM departments d JOIN employees e ON e.department_id = d.id "
     "GROUP BY d.id, d.name"),
    ("How many distinct customers ordered products in the Software category?",
     "SELECT COUNT(DISTINCT o.customer_id) FROM orders o JOIN products p ON o.product_id = p.id "
     "WHERE p.category = 'Software'"),
    ("What is the total revenue (quantity times price) per product category? Give the category and the revenue.",
     "SELECT p.category, SUM(o.quantity * p.price) FROM orders o JOIN products p ON o.product_id = p.id "
     "GROUP BY p.category"),
    ("How many employees were hired in each year? Give the year and the count.",
     "SELECT hire_year, COUNT(*) FROM employees GROUP BY hire_year"),
    ("For the orders placed by customers from France, give the customer name and the order id.",
     "SELECT c.name, o.id FROM orders o JOIN customers c ON o.customer_id = c.id WHERE c.country = 'France'"),
    ("What is the total quantity of all orders placed in 2023?",
     "SELECT SUM(quantity) FROM orders WHERE order_date LIKE '2023-%'"),
    ("List the ids of orders with a quantity of at least 5 that were delivered.",
     "SELECT id FROM orders WHERE quantity >= 5 AND status = 'delivered'"),
    ("Which departments have a budget above the average department budget? Give their names and budgets.",
     "SELECT name, budget FROM departments WHERE budget > (SELECT AVG(budget) FROM departments)"),
    ("For each department city, how many employees work there? Give the city and the count.",
     "SELECT d.city, COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id GROUP BY d.city"),
    ("What is the average quantity per order for each order status? Give the status and the average.",
     "SELECT status, AVG(quantity) FROM orders GROUP BY status"),
    ("How many cancelled orders did each customer have? Give the customer name and the count, for customers "
     "with at least one cancelled order.",
     "SELECT c.name, COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id "
     "WHERE o.status = 'cancelled' GROUP BY c.id, c.name"),
    ("List the names of the employees who have handled orders of Cloud products (each name once).",
     "SELECT DISTINCT e.name FROM orders o JOIN employees e ON o.employee_id = e.id "
     "JOIN products p ON o.product_id = p.id WHERE p.category = 'Cloud'"),
    ("What is the difference between the highest and the lowest salary?",
     "SELECT MAX(salary) - MIN(salary) FROM employees"),
    ("Which customers placed more than 6 orders? Give their names.",
     "SELECT c.name FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.id, c.name "
     "HAVING COUNT(*) > 6"),
]


# question template -> query template, filled from SLOTS: the same question asked of another department,
# city, year or threshold. The held-out tasks are fills no training task has, so a model that learns to
# carry the question's value into its query generalises, and one that memorised queries does not.
_EMPLOYEES_OF = "FROM employees e JOIN departments d ON e.department_id = d.id WHERE d.name = '{dept}'"
TEMPLATES: list[tuple[str, str, str]] = [  # (slot, question, query)
    ("dept", "How many employees work in the {dept} department?", "SELECT COUNT(*) " + _EMPLOYEES_OF),
    ("dept", "List the names of the employees in the {dept} department.", "SELECT e.name " + _EMPLOYEES_OF),
    ("dept", "What is the average salary in the {dept} department?", "SELECT AVG(e.salary) " + _EMPLOYEES_OF),
    ("dept", "What is the highest salary in the {dept} department?", "SELECT MAX(e.salary) " + _EMPLOYEES_OF),
    ("city", "List the names of the departments located in {city}.", "SELECT name FROM departments WHERE city = '{city}'"),
    ("country", "How many customers are from {country}?", "SELECT COUNT(*) FROM customers WHERE country = '{country}'"),
    ("country", "List the names of the customers from {country}.", "SELECT name FROM customers WHERE country = '{country}'"),
    ("category", "List the names of the products in the {category} category.",
     "SELECT name FROM products WHERE category = '{category}'"),
    ("status", "How many orders have the status {status}?", "SELECT COUNT(*) FROM orders WHERE status = '{status}'"),
    ("title", "How many employees have the title {title}?", "SELECT COUNT(*) FROM employees WHERE title = '{title}'"),
    ("year", "List the names of the employees hired in {year}.", "SELECT name FROM employees WHERE hire_year = {year}"),
    ("salary", "List the names of the employees who earn more than {salary}.",
     "SELECT name FROM employees WHERE salary > {salary}"),
    ("price", "List the names of the products that cost less than {price}.",
     "SELECT name FROM products WHERE price < {price}"),
]
SLOTS: dict[str, list] = {
    "dept": [name for name, _, _ in DEPARTMENTS],
    "city": sorted({city for _, city, _ in DEPARTMENTS}),
    "country": COUNTRIES,
    "category": sorted({category for _, category, _ in PRODUCTS}),
    "status": sorted(set(STATUSES)),
    "title": sorted({title for titles in TITLES.values() for title in titles}),
    "year": list(range(2012, 2025)),
    "salary": list(range(40000, 125001, 5000)),  # every threshold leaves someone above it
    "price": [20, 40, 50, 80, 100, 150, 200, 300, 500, 700, 1000],
}
HELD_OUT = 40  # templated tasks held out (the last lines of the task file)


def templated_tasks(seed: int = 0) -> list[tuple[str, str]]:
    """Every fill of every template as (question, query), shuffled with `seed`. Left out: a fill whose
    question or query a hand-written question already has, and one whose result on the database an
    earlier fill of its template already gives: either would put a training answer (or a constant) in
    the held-out set."""
    def norm(text: str) -> str:
        return " ".join(text.lower().replace("the ", "").replace("all ", "").split())

    known = {norm(question) for question, _ in QUESTIONS} | {norm(query) for _, query in QUESTIONS}
    pairs = [(question.format(**{slot: value}), query.format(**{slot: value}))
             for slot, question, query in TEMPLATES for value in SLOTS[slot]]
    pairs = [(question, query) for question, query in pairs if not {norm(question), norm(query)} & known]
    # a fill whose result another fill of its template already gives (two departments with the same top
    # salary) would be answered by that fill's query or by a constant: keep the first of them only
    connection, kept, seen = sqlite3.connect(f"file:{DATABASE}?mode=ro", uri=True), [], set()
    try:
        for (question, query), (_, template, _) in zip(pairs, _template_of(pairs)):
            result = (template, repr(sorted(connection.execute(query).fetchall(), key=repr)))
            if result not in seen:
                seen.add(result)
                kept.append((question, query))
    finally:
        connection.close()
    pairs = kept
    random.Random(seed).shuffle(pairs)
    return pairs


def _template_of(pairs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(slot, question template, query template) of each (question, query) fill."""
    found = []
    for question, _ in pairs:
        found.append(next(row for row in TEMPLATES if question.startswith(row[1].split("{")[0])
                          and question.endswith(row[1].split("}")[-1])))
    return found


def write_tasks(path: str | Path = TASKS) -> Path:
    """Write the JSONL task file: one {id, prompt, metadata: {reference_query}} per question, the
    hand-written QUESTIONS and the templated fills first (training), then HELD_OUT templated fills
    (the scenario's tasks.eval_count holds them out)."""
    path = Path(path)
    templated = templated_tasks()
    pairs = QUESTIONS + templated[HELD_OUT:] + templated[:HELD_OUT]
    lines = [json.dumps({"id": f"text_to_sql-{index}", "prompt": question,
                         "metadata": {"reference_query": query}})
             for index, (question, query) in enumerate(pairs)]
    path.write_text("\n".join(lines) + "\n")
    return path


def expert(agent: str, observation: str, task) -> str:
    """The reference query of the task."""
    return task.metadata["reference_query"]


if __name__ == "__main__":
    print(build_database(), write_tasks())
