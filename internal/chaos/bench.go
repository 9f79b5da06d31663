package chaos
