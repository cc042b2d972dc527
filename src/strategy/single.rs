//! `single`: one device, no communication. It is ddp with a world of one: the broadcast and
//! all-reduce of a single rank do nothing, so one implementation serves both.

pub type Single = super::Ddp;
