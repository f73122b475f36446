"""The app's pages, listed once: main.py's navigation and the walkthrough's onward links are both drawn
from PAGES, so a new page appears in both."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Page:
    path: Path
    title: str
    icon: str
    url_path: str | None = None  # None: the default page, served at the root address
    section: str = ""            # the navigation's heading; "" is the unheaded top group

    @property
    def link(self) -> str:
        """The onward link's label: the link list has no headings, so a section's name goes in front."""
        return f"{self.section}: {self.title[0].lower()}{self.title[1:]}" if self.section else self.title


PAGES = (
    Page(ROOT / "pages" / "walkthrough.py", "Start here: guided walkthrough", ":material/flag:"),
    Page(ROOT / "pages" / "step.py", "Step by step", ":material/slow_motion_video:", url_path="step"),
    Page(ROOT / "pages" / "race.py", "Race", ":material/sports_score:", url_path="race"),
    Page(ROOT / "pages" / "lesson.py", "How it works", ":material/school:", url_path="lesson"),
    Page(ROOT / "pages" / "production.py", "Road to production", ":material/rocket_launch:",
         url_path="production"),
    Page(ROOT / "pages" / "workloads.py", "Workloads", ":material/table_chart:", url_path="workloads",
         section="Measure"),
    Page(ROOT / "pages" / "drafters.py", "All drafters, one prompt", ":material/compare_arrows:",
         url_path="drafters", section="Measure"),
    Page(ROOT / "pages" / "temperature.py", "Temperature", ":material/thermostat:", url_path="temperature",
         section="Measure"),
    Page(ROOT / "pages" / "batch.py", "Batch size", ":material/stacks:", url_path="batch", section="Measure"),
    Page(ROOT / "pages" / "draft_length.py", "Draft length k", ":material/straighten:", url_path="draft-length",
         section="Measure"),
    Page(ROOT / "pages" / "headroom.py", "Headroom: weight formats", ":material/memory:", url_path="headroom",
         section="Measure"),
    Page(ROOT / "pages" / "contract.py", "Output contract", ":material/fact_check:", url_path="contract",
         section="Measure"),
    Page(ROOT / "pages" / "dashboard.py", "Acceptance dashboard", ":material/monitoring:", url_path="dashboard",
         section="Measure"),
)


def navigation():
    """st.navigation over PAGES, grouped by section; the st.Page objects are made on each run, never
    shared between sessions."""
    groups: dict[str, list] = {}
    for p in PAGES:
        groups.setdefault(p.section, []).append(
            st.Page(p.path, title=p.title, icon=p.icon, url_path=p.url_path, default=p.url_path is None))
    return st.navigation(groups)
