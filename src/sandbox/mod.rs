pub mod tar_safety;
