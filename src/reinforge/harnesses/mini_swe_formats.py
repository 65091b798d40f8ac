"""Action formats for mini-swe-agent: how it finds the command in a reply, and the prompts that teach it.

mini-swe-agent's text-based config wants exactly one ```` ```mswea_bash_command ```` block per reply.
A small model (SmolLM2-135M-Instruct) never writes that language tag: every reply is a format error,
mini-swe-agent keeps only its error message in the history (the reply is dropped), so no call
extends the one before and nothing merges. `PLAIN_BASH` asks for what such a model does write, a
```` ```bash ```` block, shows one in a worked example, and parses leniently. It is set through
mini-swe-agent's own config keys (`--config key=value`): its code is not changed.
"""

from __future__ import annotations

from dataclasses import dataclass

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The command with which mini-swe-agent's model says the task is done."""


@dataclass(frozen=True)
class ActionFormat:
    """Values for mini-swe-agent's `model.action_regex`, `model.format_error_template`,
    `agent.system_template` and `agent.instance_template` (Jinja; `{{task}}` is the instruction)."""

    name: str
    action_regex: str
    system_template: str
    instance_template: str
    format_error_template: str

    def config_args(self) -> list[str]:
        """`--config key=value` pairs for the `mini` command line (after its base config file)."""
        values = {
            "model.action_regex": self.action_regex,
            "model.format_error_template": self.format_error_template,
            "agent.system_template": self.system_template,
            "agent.instance_template": self.instance_template,
        }
        # mini-swe-agent splits a spec at its first "=" (the key has none) and reads the value as
        # JSON when it parses: none of these texts is JSON, so each arrives verbatim.
        return [arg for key, value in values.items() for arg in ("--config", f"{key}={value}")]

    def reply(self, command: str, thought: str = "I will run this next.") -> str:
        """One well-formed reply in this format (what a scripted test backend answers)."""
        return f"{thought}\n```bash\n{command}\n```"


# The first fenced block of the reply, whatever its language tag (bash, sh, none), up to its closing
# fence or the end of the reply: a reply cut off by max_tokens still runs its command. `\A` makes
# re.findall return at most one match, so a reply with two blocks is not a format error either.
_FIRST_FENCED_BLOCK = r"\A.*?```[\w-]*[ \t]*\n(.*?)(?:\n```|\Z)"

PLAIN_BASH = ActionFormat(
    name="plain-bash",
    action_regex=_FIRST_FENCED_BLOCK,
    system_template=(
        "You are a helpful assistant that solves tasks by running bash commands.\n"
        "Reply with one short sentence, then exactly one bash command in a ```bash code block.\n"
        "You will see the command's output, then you reply with the next command.\n"
        f"When the task is done, reply with:\n```bash\n{SUBMIT}\n```"
    ),
    # A worked example, in the reply format, before the task: a 135M model copies the form it sees.
    instance_template=(
        "Example task: Create a file named `notes.txt` whose content is the line `todo`.\n"
        "Example reply:\n"
        "I write the line into the file.\n"
        "```bash\n"
        "echo 'todo' > notes.txt\n"
        "```\n"
        "\n"
        "Task: {{task}}\n"
        "Reply with one bash command in a ```bash code block."
    ),
    format_error_template=(
        "Your reply had no command. Reply with exactly one bash command in a code block:\n```bash\nls\n```"
    ),
)
"""What SmolLM2-135M-Instruct writes: a ```bash block (docs/harnesses.md, "mini-swe-agent on SmolLM2")."""
