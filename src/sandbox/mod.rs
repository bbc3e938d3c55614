pub mod docker_image;
