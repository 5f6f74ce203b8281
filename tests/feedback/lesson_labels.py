"""Lessons labelled by hand, good or junk, for the admission rule (`lanpo.feedback.summarize.check_summary`).

Each item is a summary as the pool would receive it, its problem's question and final answer, and its label: "good",
an abstract lesson of its problem's method under ## Flow / ## Principles / ## Pitfalls, or the kind of junk it is
(`JUNK_KINDS`). The kind is what a reader sees in the text, not the rule's reason: a loop that also fails the format
is still a "loop" here, so that the set measures the rule rather than restating it.

Sources (`source`): "written" items are ours, the good ones in the manner of a capable summariser (varied wording,
lengths, lists, sub-steps; many name the question's own terms, "sum", "numbers", "the final answer"), the junk ones
in the manner of the real ones. The SMOLLM2_* items are real: SmolLM2-135M-Instruct (the offline GGUF, no adapter)
through `summarise(..., scaffold=True)` with 96 new tokens, on chain sums and small word problems, at temperature
0.7 or 1.0, copied verbatim (2026-12-06, 48 summaries: 4 problems x 3 candidates x 2 temperatures, twice). None of
the 48 was a good lesson; the rule before the content checks admitted 15 of them, the rule now 7 (the other 8
refused as `copied`), and the 7 it still admits are fluent text about nothing (kinds "gibberish" and "fluff"), which
no check of form can tell from a lesson.
"""

from __future__ import annotations

from dataclasses import dataclass

JUNK_KINDS = ("empty", "hints", "loop", "copied", "restates", "repeats", "gibberish", "fluff")
SMOLLM2_T07 = "smollm2-135m, scaffolded, temperature 0.7"
SMOLLM2_T10 = "smollm2-135m, scaffolded, temperature 1.0"

CHAIN = "State the final answer to the following arithmetic problem: {} ="


@dataclass(frozen=True)
class Labelled:
    """A summary, its problem, and its label: "good" or one of `JUNK_KINDS`."""

    text: str
    question: str
    answer: str
    kind: str
    source: str = "written"

    @property
    def good(self) -> bool:
        """Whether the pool should take it."""
        return self.kind == "good"


def lesson(*lines: str) -> str:
    """A summary's text from its lines."""
    return "\n".join(lines)


ANNA = (
    "Anna has 3 red pens and 4 blue pens. She loses 2 pens. How many pens does she have left? Give the result as "
    "your final answer. Do not include units."
)
JAMES = (
    "James gets 160 emails a day. 30% of those emails don't require any response. James responds to the rest of "
    "them. How many emails does James respond to in a 5 day work week? Give the result as your final answer. Do "
    "not include units."
)
MICHAEL = (
    "Michael has a bag of pebbles with 72 inside. He tripped over stick while carrying it and dropped 54 of them. "
    "He scrambled to search for them but only came up with 4. When he went back home, he inspected the pebbles "
    "further. 3 of them he picked up wasn't a pebbles, but actually coins so he got rid of it. How many pebbles did "
    "Michael end up with? Give the result as your final answer. Do not include units."
)
SUM_OF = "What is the sum of the numbers 3, 14, 22 and 9?"
SAM = "Sam reads 6 pages on Monday and twice as many on Tuesday. How many pages does he read in total?"

GOOD = [
    Labelled(
        lesson(
            "## Flow",
            "Work left to right: subtract the second term from the first, then subtract the third from that result.",
            "## Principles",
            "- Subtraction is not commutative, so keep the written order.",
            "- When the amount taken away is larger, the result drops below zero and keeps its minus sign.",
            "## Pitfalls",
            "- Losing the minus sign on the final value.",
            "- Subtracting the last two terms first.",
        ),
        CHAIN.format("4 - 1 - 7"),
        "-4",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "1. Add the first two terms, column by column.",
            "2. Add the third term to that partial sum.",
            "3. Box the last total.",
            "## Principles",
            "- Settle the units column first and carry any ten into the tens column.",
            "- A sum of three two-digit numbers can pass one hundred, so leave room for a third digit.",
            "## Pitfalls",
            "- Forgetting the carry when the units add up to more than nine.",
            "- Writing the partial sum as the final answer.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Add the numbers from left to right, keeping a running total.",
            "## Principles",
            "Single digits can be added in your head, one at a time.",
            "## Pitfalls",
            "Skipping a term of the sum.",
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Evaluate from left to right. The first subtraction goes negative, so compute it as the larger minus the "
            "smaller and attach the minus sign; then add the last term to that negative value.",
            "## Principles",
            "- Adding a positive number to a negative one is the same as subtracting their sizes and keeping the sign "
            "of the larger.",
            "- Line up hundreds, tens and units before borrowing.",
            "## Pitfalls",
            "- Dropping the sign of the intermediate value.",
            "- Borrowing from the hundreds but not lowering that digit.",
        ),
        CHAIN.format("205 - 838 + 505"),
        "-128",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "First combine the two groups into one total, then take away what was lost.",
            "## Principles",
            '- "How many ... left" after a loss means subtraction from the combined amount.',
            "- Collect all items of the same kind before removing any.",
            "## Pitfalls",
            "- Subtracting the loss from only one of the groups.",
            "- Reporting the total before the loss as the answer.",
        ),
        ANNA,
        "5",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Find the share of items that do need a reply (the whole minus the percentage that does not), apply it to "
            "the daily count, then scale the daily figure up to the number of days asked for.",
            "## Principles",
            '- A percentage that "don\'t require" something leaves its complement: one hundred percent minus it.',
            "- Multiply a per-day amount by the number of days only at the end, to keep the numbers small.",
            "## Pitfalls",
            "- Applying the percentage to both the daily and the weekly total, counting it twice.",
            "- Using seven days when the question says a work week.",
        ),
        JAMES,
        "560",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Track the count through each event in order: start, subtract what fell, add back what was found, "
            "subtract the items that turn out not to belong.",
            "## Principles",
            "- Write one line per event so no change is skipped.",
            "- Items that were counted but are not of the asked kind must be removed at the end.",
            "## Pitfalls",
            "- Adding the dropped amount instead of subtracting it.",
            "- Forgetting the final removal of the coins.",
        ),
        MICHAEL,
        "19",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "To find the sum of the numbers, pair terms that make round values first, then add the rest.",
            "## Principles",
            "- Addition can be regrouped: the order of the terms does not change the sum.",
            "- Check the count of terms before and after regrouping.",
            "## Pitfalls",
            "- Leaving one of the numbers out when regrouping.",
            "- Adding a number twice.",
        ),
        SUM_OF,
        "48",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            'Turn "twice as many" into a multiplication of the first day\'s amount, then add both days for the total.',
            "## Principles",
            '- Comparative phrases ("twice as many", "three more than") describe the second quantity from the first.',
            '- "In total" asks for the sum of all parts, not the last part.',
            "## Pitfalls",
            "- Reporting only the second day's amount.",
            "- Adding two instead of doubling.",
        ),
        SAM,
        "18",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Do the division first, keep it as a fraction, then write the whole number over the same denominator and "
            "add the numerators.",
            "## Principles",
            "- A division that does not come out even stays an exact fraction.",
            "- To add a whole number to a fraction, rewrite it with the fraction's denominator.",
            "## Pitfalls",
            "- Rounding the quotient to a decimal.",
            "- Adding the whole number to both numerator and denominator.",
        ),
        CHAIN.format("7 / 4 + 1"),
        "11/4",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Compute small powers of the base modulo the divisor until the remainders repeat, find the cycle length, "
            "and reduce the exponent by it.",
            "## Principles",
            "- Remainders of powers cycle; only the exponent's place in the cycle matters.",
            "- Reduce at every step so the numbers stay small.",
            "## Pitfalls",
            "- Computing the full power before dividing.",
            "- An off-by-one slip in the position within the cycle.",
        ),
        "What is the remainder when 2^10 is divided by 7?",
        "2",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Turn the discount into the fraction of the price that remains, and multiply the original price by it.",
            "## Principles",
            "- A percentage off leaves the complement of that percentage to pay.",
            "- Convert percentages to fractions when they are simple ones like quarters or halves.",
            "## Pitfalls",
            "- Giving the discount amount instead of the sale price.",
            "- Subtracting the percentage number itself from the price.",
        ),
        "A shirt costs $40 and is on sale for 25% off. What is the sale price?",
        "30",
        "good",
    ),
    Labelled(  # an SFT target of the demo (lanpo.train.sft.pairs.lesson_for)
        lesson(
            "## Flow",
            "Do an addition, then a subtraction one at a time, keeping every partial value on its own line; the last "
            "one is what gets boxed.",
            "## Principles",
            "- When the units add up to ten or more, carry one into the tens.",
            "- When the units digit on top is smaller, borrow ten from the tens first.",
            "- With two-digit operands, settle the units first, then the tens.",
            "- Keep the order of operations: multiply and divide before adding and subtracting.",
            "## Pitfalls",
            "- Dropping the carry when the units overflow.",
            "- Taking the smaller units digit from the larger one instead of borrowing.",
            "- Stating the last value without checking it: a slip of one goes unnoticed.",
            "- Leaving the final value unboxed.",
        ),
        CHAIN.format("38 + 47 - 9"),
        "76",
        "good",
    ),
    Labelled(  # an SFT target of the demo (lanpo.train.sft.pairs.lesson_for)
        lesson(
            "## Flow",
            "Read the expression from left to right and do a multiplication, then a division, each on a line of its "
            "own, then box the last value.",
            "## Principles",
            "- With single digits the whole operation fits on one line.",
            "- Keep the order of operations: multiply and divide before adding and subtracting.",
            "## Pitfalls",
            "- Stating the last value without checking it: a slip of one goes unnoticed.",
            "- Ending without the box around the final value.",
        ),
        CHAIN.format("7 * 6 / 5"),
        "42/5",
        "good",
    ),
    Labelled(
        lesson(
            "### Flow",
            "**Step 1.** Identify the chain of operations and its order.",
            "**Step 2.** Combine the first pair of terms using column addition.",
            "**Step 3.** Add the remaining term to the running sum, again column by column.",
            "**Step 4.** Re-add in a different order as a check, then box the result.",
            "### Principles",
            "- Column addition: units, then tens, then hundreds, carrying whenever a column reaches ten.",
            "- A second pass in another order catches most slips, since the two passes share no partial sums.",
            "### Pitfalls",
            "- Misaligned columns when terms have different numbers of digits.",
            "- Trusting the first pass without checking it.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow", "Add left to right.", "## Principles", "Keep a running total.", "## Pitfalls", "Skipped terms."
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "good",
    ),
    Labelled(  # the pitfall turns the principle round, in a phrase of its words
        lesson(
            "## Flow",
            "Subtract in the order written, one operation per line.",
            "## Principles",
            "- Carry the minus sign of a negative partial result into the next line.",
            "## Pitfalls",
            "- Forgetting to carry the minus sign into the next line.",
        ),
        CHAIN.format("4 - 1 - 7"),
        "-4",
        "good",
    ),
    Labelled(  # a pitfall that repeats a principle's clause of nine words, among words of its own
        lesson(
            "## Flow",
            "Add the terms in the order written, writing each partial sum on its own line.",
            "## Principles",
            "- When the units add up to ten or more, carry one into the tens.",
            "- Line the digits up by place value.",
            "## Pitfalls",
            "- Forgetting to carry one into the tens when the units add up to ten or more.",
            "- Boxing a partial sum.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "good",
    ),
    Labelled(  # names the template's words, in sentences of its own
        lesson(
            "## Flow",
            "The flow of thought: gather every quantity mentioned, decide which ones are added and which are taken "
            "away, then do the additions before the removals.",
            "## Principles",
            "- Read each sentence as one event that changes the count.",
            "## Pitfalls",
            "Mistakes to avoid: subtracting before all the items are gathered, and answering with a count from the "
            "middle of the story.",
        ),
        ANNA,
        "5",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Isolate the variable: undo the addition on its side by subtracting from both sides, then undo the "
            "multiplication by dividing both sides by the coefficient.",
            "## Principles",
            "- Whatever is done to one side of an equation is done to the other.",
            "- Undo operations in the reverse order of how they were applied to the variable.",
            "## Pitfalls",
            "- Dividing only one term by the coefficient.",
            "- Skipping the substitution back, so a sign slip goes unnoticed.",
        ),
        "Solve for x: 3x + 7 = 22.",
        "5",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Use the perimeter to recover the missing side (half the perimeter is length plus width), then multiply "
            "the two sides for the area.",
            "## Principles",
            "- Perimeter adds all four sides; area multiplies two adjacent ones.",
            "- Halving the perimeter gives one length plus one width.",
            "## Pitfalls",
            "- Mixing up perimeter and area.",
            "- Subtracting the length from the whole perimeter instead of from half of it.",
        ),
        "A rectangle has a perimeter of 30 and a length of 9. What is its area?",
        "54",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "- Find the total made: groups times items per group.",
            '  - Read "trays of" as a group size.',
            "- Take away the number sold.",
            "- Answer with what remains.",
            "## Principles",
            "Multiplication counts equal groups; subtraction removes a part from a whole. A question about how many "
            "are left always ends with the removal.",
            "## Pitfalls",
            "Adding the number of trays to the muffins per tray instead of multiplying; answering with what was sold "
            "instead of what remains.",
        ),
        "A baker makes 4 trays of 12 muffins and sells 30 of them. How many muffins are left?",
        "18",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Do the multiplication before the subtraction, then subtract from the product.",
            "## Principles",
            "- Multiplication and division bind tighter than addition and subtraction.",
            "- Know the times tables up to ten by heart to avoid slow repeated addition.",
            "## Pitfalls",
            "- Subtracting first because it appears on the right.",
            "- Misremembering a times-table fact.",
        ),
        CHAIN.format("6 * 7 - 4"),
        "38",
        "good",
    ),
    Labelled(  # the question's own words, "the final answer", "sum", "numbers", in a lesson
        lesson(
            "## Flow",
            "The problem asks for a sum of small numbers: add the first two numbers, then add the third number to "
            "that sum.",
            "## Principles",
            "- The sum of numbers does not depend on the order they are added in.",
            "- Small numbers can be grouped to make ten when possible.",
            "## Pitfalls",
            "- Answering with the sum of only the first two numbers.",
            "- Forgetting to state the final answer in a box.",
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "good",
    ),
    Labelled(
        lesson(
            "## Flow",
            "This is a division in disguise: the goal amount is split into equal weekly parts, so divide the goal by "
            "the weekly saving. If it does not divide evenly, round up, because a partial week still has to be waited "
            "out.",
            "## Principles",
            "Repeated equal additions toward a goal are a division. When the answer counts whole periods, any "
            "remainder means one more period.",
            "## Pitfalls",
            "Multiplying the two amounts because both appear in the question; rounding down when there is a "
            "remainder.",
        ),
        "Lena saves 15 dollars a week. How many weeks does she need to save 120 dollars?",
        "8",
        "good",
    ),
]

WRITTEN_JUNK = [
    Labelled("## Flow\n\n## Principles\n\n## Pitfalls", CHAIN.format("4 - 1 - 7"), "-4", "empty"),
    Labelled("## Flow\n-\n## Principles\n-\n## Pitfalls\n-", ANNA, "5", "empty"),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps) first",
            "## Principles",
            "(transferable rules) always",
            "## Pitfalls",
            "(mistakes to avoid) never",
        ),
        SAM,
        "18",
        "hints",
    ),
    Labelled(  # the hints, and a few words after each
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "Add them up.",
            "## Principles",
            "(transferable rules)",
            "Carry tens.",
            "## Pitfalls",
            "(mistakes to avoid)",
            "Lost carries.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "hints",
    ),
    Labelled(  # the template's instructions, with a word or two of its own
        lesson(
            "## Flow",
            "Distil this into a lesson that helps on other, similar problems for students.",
            "## Principles",
            "Describe the method in abstract steps for every learner.",
            "## Pitfalls",
            "Do not repeat this problem's numbers or its final result ever.",
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "hints",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Add the numbers. Add the numbers. Add the numbers. Add the numbers. Add the numbers.",
            "## Principles",
            "Add the numbers one by one.",
            "## Pitfalls",
            "Forgetting a number.",
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "loop",
    ),
    Labelled(
        "## Flow\nThe sum of the the the the the the the the the the the the\n## Principles\nCarry the tens.\n"
        "## Pitfalls\nLost carries.",
        CHAIN.format("57 + 87 + 70"),
        "214",
        "loop",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Read the terms and add them in order.",
            "## Principles",
            "- Carry into the tens.",
            "## Pitfalls",
            "- Forgetting the carry.",
            "- Forgetting the carry.",
            "- Forgetting the carry.",
            "- Forgetting the carry.",
            "- Forgetting the carry.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "loop",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Step 1: add. Step 2: add. Step 3: add. Step 4: add. Step 5: add. Step 6: add.",
            "## Principles",
            "Use the rules of addition.",
            "## Pitfalls",
            "Counting wrong.",
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "loop",
    ),
    Labelled(
        lesson(
            "## Flow",
            "The method is to add the first two numbers and then the next one. The method is to add the first two "
            "numbers and then the next one.",
            "## Principles",
            "Addition works in any order.",
            "## Pitfalls",
            "Dropping a term.",
        ),
        SUM_OF,
        "48",
        "loop",
    ),
    Labelled(
        lesson(
            "## Flow",
            "The key is to understand the problem, understand the problem, understand the problem, understand the "
            "problem and",
            "## Principles",
            "The problem is the problem is the problem is the problem is",
            "## Pitfalls",
            "not understanding the problem, the problem, the problem",
        ),
        SAM,
        "18",
        "loop",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Add the tens, then the units, then the units, then the units, then the units, then the units",
            "## Principles",
            "Place value decides which digits combine.",
            "## Pitfalls",
            "Mixing tens and units.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "loop",
    ),
    Labelled(  # the whole lesson written twice
        lesson(
            "## Flow",
            "Add left to right.",
            "## Principles",
            "Carry the tens.",
            "## Pitfalls",
            "Lost carries.",
            "## Flow",
            "Add left to right.",
            "## Principles",
            "Carry the tens.",
            "## Pitfalls",
            "Lost carries.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "loop",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Add the numbers in order and check the total.",
            "## Principles",
            "Add the numbers in order and check the total.",
            "## Pitfalls",
            "Add the numbers in order and check the total.",
        ),
        SUM_OF,
        "48",
        "copied",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Work through each operation in turn.",
            "## Principles",
            "Carry the tens.",
            "## Pitfalls",
            "Carry the tens.",
        ),
        CHAIN.format("57 + 87 + 70"),
        "214",
        "copied",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Anna has 3 red pens and 4 blue pens. She loses 2 pens.",
            "## Principles",
            "How many pens does she have left?",
            "## Pitfalls",
            "Give the result as your final answer. Do not include units.",
        ),
        ANNA,
        "5",
        "restates",
    ),
    Labelled(
        lesson(
            "## Flow",
            "State the final answer to the following arithmetic problem.",
            "## Principles",
            "The following arithmetic problem: 1 + 5 + 3.",
            "## Pitfalls",
            "State the final answer.",
        ),
        CHAIN.format("1 + 5 + 3"),
        "9",
        "restates",
    ),
    Labelled(  # the question with its numbers changed, as SmolLM2 restates it
        lesson(
            "## Flow",
            "Sam reads 4 pages on Monday and twice as many on Tuesday.",
            "## Principles",
            "How many pages does he read in total? He reads twice as many.",
            "## Pitfalls",
            "Sam reads pages on Monday and on Tuesday.",
        ),
        SAM,
        "18",
        "restates",
    ),
    Labelled(
        lesson(
            "## Flow",
            "Michael has a bag of pebbles. He tripped over stick while carrying it and dropped some of them.",
            "## Principles",
            "He scrambled to search for them but only came up with a few.",
            "## Pitfalls",
            "When he went back home, he inspected the pebbles further.",
        ),
        MICHAEL,
        "19",
        "restates",
    ),
    Labelled(
        lesson(
            "## Flow",
            "What is the sum of the numbers?",
            "## Principles",
            "The sum of the numbers is the sum.",
            "## Pitfalls",
            "What is the sum of the numbers, and what is the answer?",
        ),
        SUM_OF,
        "48",
        "restates",
    ),
]

REAL_JUNK = [
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "## Principles",
            "(transforming rules)",
            "## Pitfalls",
            "(mistakes to avoid)",
        ),
        "State the final answer to the following arithmetic problem: 17 + 25 - 8 =",
        "34",
        "hints",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "## Principles",
            "(transferable rules)",
            "## Pitfalls",
            "(mistakes to avoid)",
        ),
        "Tom has 12 apples and buys 15 more. He gives 7 to Sara. How many apples does Tom have now?",
        "20",
        "hints",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "**Introduce the variable: 20 * 0 ≡ 2**",
            "## Principles",
            "Set up an equation with the addition of 20 so nothing is left, so with no finished solution.",
            "***",
            "## Pitfalls",
            "**Transferable rules** setup an equation to set up logical ones.",
            "Your original solution to a math problem 2 * 3 is actually 6",
        ),
        "State the final answer to the following arithmetic problem: 17 + 25 - 8 =",
        "34",
        "hints",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(due to this design, even simple fractions require careful considerations)",
            "## Principles",
            "(important rules, relevant to the problem)",
            "## Pitfalls",
            "(disregardable mistakes, should exercise caution when dealing with complex problems)",
        ),
        "What is the sum of the numbers 3, 14, 22 and 9?",
        "48",
        "hints",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "Persistent repetition",
            "first a formula",
            "## Principles",
            "(transferable rules)",
            "multiplicative constants when adding integers",
            "1 + 5 + 3 =",
            "## Pitfalls",
            "(mistakes to avoid)",
            "This is an example of Strategy B Non-specific Challenge (C3N)SNAP",
            "Can be adapted to a",
        ),
        "State the final answer to the following arithmetic problem: 1 + 5 + 3 =",
        "9",
        "hints",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "### Problem-Creation",
            "## Principles",
            "### Solving Long Division",
            "## Pitfalls",
            "### Error-Reminder Practice",
        ),
        "State the final answer to the following arithmetic problem: 17 + 25 - 8 =",
        "34",
        "empty",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "A solution that worked.",
            "The method is a normal and valid example of a method that is not only a normal and valid example, but "
            "also a regular and",
            "## Principles",
            "This method is a method that is not only a normal and valid example but also a regular and",
            "## Pitfalls",
            "This is a method that is not only a normal and valid example but also a regular and",
        ),
        "Tom has 12 apples and buys 15 more. He gives 7 to Sara. How many apples does Tom have now?",
        "20",
        "copied",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "Many problems in mathematics are solved through simple, easy-to-follow and elegant methods. This is a",
            "## Principles",
            "(transferable rules)",
            "There are many problems in mathematics that can be solved by applying the principles of math. This is a",
            "## Pitfalls",
            "(mistakes to avoid)",
            "In mathematics, there are many problems that can be solved by applying the principles of math. This is a",
        ),
        "What is the sum of the numbers 3, 14, 22 and 9?",
        "48",
        "copied",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "Many problems have an obvious solution. This problem is similar to many algebraic and logical problems. "
            "It requires a",
            "## Principles",
            "(transferable rules)",
            "The solution to this problem is based on the principles of mathematics. It uses the tools of algebra and",
            "## Pitfalls",
            "(mistakes to avoid)",
            "The following problem is similar to many algebraic and logical problems. It requires a",
        ),
        "Sam reads 6 pages on Monday and twice as many on Tuesday. How many pages does he read in total?",
        "18",
        "copied",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "The method used to solve this problem is a typical approach to solving similar problems. By focusing on "
            "the process of calculation and the rules of math, it helps to",
            "## Principles",
            "the process of calculation and the rules of math. This method is a typical approach to solving similar "
            "problems. The solution uses the basic math applied to the original problem",
            "## Pitfalls",
            "the tendency to avoid the rules of math and the way it can sometimes be used to avoid correct answers.",
        ),
        "Sam reads 6 pages on Monday and twice as many on Tuesday. How many pages does he read in total?",
        "18",
        "copied",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "1. The process of solving arithmetic problems is based on a simple yet fundamental concept: the "
            "difference between a",
            "## Principles",
            "(transverse rules)",
            "2. This is the essence of the mathematical process of decomposition. This is demonstrated in the "
            "process of decomposition",
            "## Pitfalls",
            "(mistakes to avoid)",
            "The process of decomposition is based on the process of decomposition. This is demonstrated in the "
            "process of decomposition",
        ),
        "State the final answer to the following arithmetic problem: 4 - 1 - 7 =",
        "-4",
        "copied",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "I conducted a series of written exercises to help open a room, distribute compensation, and discover a "
            "firm foundation.",
            "## Principles",
            "Deliberate, instructional minute.",
            "## Pitfalls",
            "Not every rule aligns to every possible situation, so to reasonably think about them.",
        ),
        "Tom has 12 apples and buys 15 more. He gives 7 to Sara. How many apples does Tom have now?",
        "20",
        "gibberish",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "1. One does not need to check every step, You write problems that seem to effortlessly repeat in lazy "
            "way; These tasks can be very rewarding I estimate daily",
            "## Principles",
            "1. Simplify and explain and to your brain is each task is accomplish",
            "2. Yes",
            "## Pitfalls",
            "Begin by making a); Thinking not a hard and up. Of suggestions depends on to break tasks you can manage "
            "to light in its entire life and name; All",
        ),
        "A train travels 60 km in the first hour and 45 km in the second. How far does it travel in total?",
        "105",
        "gibberish",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "I conducted a series of written exercises to help open a room. Here's an example of how I presented a "
            "lesson on this:",
            "## Principles",
            "Remember to follow the steps outlined to present a lesson that uses the principles with fiction, on a "
            "set basis, on an imaginary paper that you draw a person:",
            "## Pitfalls",
            "Memorisaonda, 2017.",
            "Bien al amecal, in Mexico.",
        ),
        "State the final answer to the following arithmetic problem: 1 + 5 + 3 =",
        "9",
        "gibberish",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "Stringed with context, these examples inspire other math-lovely phenomena. By crafting lessons that "
            'contrast the "on a par with mathematics:"',
            "- 2",
            "## Principles",
            "I have developed many lessons that may not accurately reflect other books. Teamwork finished teaching "
            "in this session with another notebook that I created. Instead of cleaning a pair",
            "## Pitfalls",
            "Large collections of material. Whether it is offering material is forbidden.",
            "There isn't engagement.",
        ),
        "State the final answer to the following arithmetic problem: 1 + 5 + 3 =",
        "9",
        "gibberish",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(due to this design, even simple context needs detail)",
            "The rules seem too technical. One.",
            "## Principles",
            "The basic rules, the reset Chemistry and biology lessons, the process. Please laugh.",
            "There's nothing to remove from.",
            "Achess, Baha.",
            "## Pitfalls",
            "Sure, the oldest rules of magic solve magic magic. Continued to get away from compassionisms.",
            "Second, In fact that is so precarnate helium,",
        ),
        "Anna has 3 red pens and 4 blue pens. She loses 2 pens. How many pens does she have left? Give the result as "
        "your final answer. Do not include units.",
        "5",
        "gibberish",
        SMOLLM2_T10,
    ),
    Labelled(
        lesson(
            "## Flow",
            "The method used to solve this problem is a classic example of the idea of decomposition and "
            "aggregation. The solution is based on a combination of mathematical and creative thinking.",
            "## Principles",
            "The method is rooted in the understanding of the human brain's ability to process information in a "
            "finite and finite time. This highlights the inspiration behind creative thinking and the",
            "## Pitfalls",
            "In this problem, there are many pitfalls that can be avoided by using the right approach. For example, "
            "in the",
        ),
        "A train travels 60 km in the first hour and 45 km in the second. How far does it travel in total?",
        "105",
        "fluff",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "The main thread of the lesson:",
            "## Principles",
            "The way to do this is to tell the story of a math problem. The story of the story will be a personal "
            "story of a math problem.",
            "It",
            "## Pitfalls",
            "The first thing you should do is to tell a story. The story is just the beginning.",
        ),
        "State the final answer to the following arithmetic problem: 4 - 1 - 7 =",
        "-4",
        "fluff",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "(the flow of thought, in abstract steps)",
            "The solution to this arithmetic problem is 1 + 5 + 3 = 9.",
            "This",
            "## Principles",
            "is:",
            "1 + 5 + 3 = 9",
            "This is a",
            "## Pitfalls",
            "is:",
            "The correct answer is",
        ),
        "State the final answer to the following arithmetic problem: 1 + 5 + 3 =",
        "9",
        "repeats",
        SMOLLM2_T07,
    ),
    Labelled(
        lesson(
            "## Flow",
            "A solution that worked:",
            "1 + 5 = 6, 6 + 3 = 9.",
            "This is an example of a classic arithmetic",
            "## Principles",
            "This is an",
            "## Pitfalls",
            "This is an",
        ),
        "State the final answer to the following arithmetic problem: 1 + 5 + 3 =",
        "9",
        "repeats",
        SMOLLM2_T07,
    ),
]

LABELLED = [*GOOD, *WRITTEN_JUNK, *REAL_JUNK]
