"""RULER's text, word for word (NVIDIA/RULER scripts/data/synthetic/constants.py, niah.py,
variable_tracking.py; scripts/data/template.py), so a model sees the prompts the paper's models saw.

Each task's prompt is HEAD + context + QUESTION, wrapped in a model template, then the ANSWER
prefix: the prompt ends inside the answer, so even a small model continues with the answer itself.
"""

from __future__ import annotations

# RULER's 'noise' haystack: one line, repeated; needles and variable chains are lines between them.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic numbers for {key} is: {value}."

# RULER's 'niah' template, split at {context}. RULER writes "numbers" everywhere and, when a single
# value is asked (queries x values == 1), replaces Some->A, 'are all'->is, are->is, numbers->number
# in the template and the answer prefix (never in the needle): these are the results.
NIAH_PLURAL = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.\n",
    "\nWhat are all the special magic numbers for {query} mentioned in the provided text?",
    " The special magic numbers for {query} mentioned in the provided text are",
)
NIAH_SINGULAR = (
    "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards.\n",
    "\nWhat is the special magic number for {query} mentioned in the provided text?",
    " The special magic number for {query} mentioned in the provided text is",
)

VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
    "\nQuestion: Find all variables that are assigned the value {query} in the text above.",
    # RULER ends this prefix with a space ("they are: "); a byte-level BPE model then has to write
    # the names without their usual leading space, so the space is left to the model.
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
    "are assigned the value {query}, they are:",
)

CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n",
    "\nQuestion: What are the 10 most common words in the above list?",
    " Answer: The top 10 words that appear most often in the list are:",
)

FWE = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words.",
    "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?",
    " Answer: According to the coded text above, the three most frequently appeared words are:",
)

# RULER's model templates ('base' is the one its synthetic prompts use for base models); the answer
# prefix follows the template, as in RULER's prepare.py. SmolLM2's is its GGUF's chat template.
MODEL_TEMPLATES = {
    "base": "{task_template}",
    "smollm2_chat": ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                     "<|im_end|>\n<|im_start|>user\n{task_template}<|im_end|>\n<|im_start|>assistant\n"),
}

# RULER's tokens_to_generate per task family.
ANSWER_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}

ALL_TEXT = (NOISE, NEEDLE, *NIAH_PLURAL, *NIAH_SINGULAR, *VT, *CWE, *FWE)
