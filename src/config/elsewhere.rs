//! Other tools' names for kiln's keys: an unknown key of such a name points to kiln's.

/// The names transformers' `TrainingArguments` (and torchrun, TRL, torchtune) give what kiln
/// calls otherwise (issue 58, defect 25): an unknown key of that name points to kiln's key.
const ELSEWHERE: &[(&str, &str, &str)] = &[
    ("gradient_accumulation_steps", "train.grad_accum_steps", ""),
    (
        "per_device_train_batch_size",
        "train.batch_size",
        " (per rank, as in transformers; the global batch is batch_size x grad_accum_steps x ranks)",
    ),
    ("learning_rate", "optim.lr", ""),
    ("lr", "optim.lr", ""),
    ("num_train_epochs", "train.epochs", ""),
    ("max_steps", "train.max_steps", ""),
    ("warmup_steps", "schedule.warmup_steps", ""),
    (
        "lr_scheduler_type",
        "schedule.kind",
        " (\"linear\", \"cosine\", \"constant\" or \"step\")",
    ),
    ("weight_decay", "optim.weight_decay", ""),
    ("max_grad_norm", "optim.grad_clip_norm", ""),
    ("seed", "experiment.seed", ""),
    ("output_dir", "experiment.output_dir", ""),
    ("eval_steps", "train.eval_every", ""),
    ("logging_steps", "train.log_every", ""),
    ("save_steps", "checkpoint.every_steps", ""),
    ("save_total_limit", "checkpoint.keep_last", ""),
    ("gradient_checkpointing", "train.activation_checkpointing", " (= \"units\")"),
];

/// kiln's key for a key of another tool's name, and a word on how it differs.
pub(super) fn known_elsewhere(field: &str) -> Option<(&'static str, &'static str)> {
    ELSEWHERE
        .iter()
        .find(|(theirs, _, _)| *theirs == field)
        .map(|(_, ours, how)| (*ours, *how))
}
