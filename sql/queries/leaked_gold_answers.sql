-- Fig. 2b's leakage arm alone (feedback.mode = "leaked-intra"; lanpo.feedback.draw.leaked_questions): each problem's
-- question and gold answer, to be stated in its prompt. No other prompt path reads this query.
SELECT id, question, answer
FROM problems
WHERE id = ANY(CAST(:ids AS bigint[]))
ORDER BY id
