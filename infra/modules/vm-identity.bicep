// Writes only the identity of an existing VM (ARM merges the rest of the VM model).

@description('Name of the existing VM.')
param vmName string

@description('Region of the VM (required by the write).')
param location string

@description('Identity type after the change.')
@allowed([
  'UserAssigned'
  'SystemAssigned, UserAssigned'
])
param identityType string

@description('All user-assigned identities the VM keeps, the forwarders\' one included.')
param userAssignedIdentities object

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' = {
  // This write carries only the identity; ARM keeps the rest of the model, which belongs to
  // whoever owns the VM. The checks below judge settings this template does not set:
  //checkov:skip=CKV_AZURE_1:OS profile (SSH keys vs passwords) is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_149:OS profile (password authentication) is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_178:OS profile (SSH keys) is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_97:Encryption at host is not set here; it is the existing VM's.
  //checkov:skip=CKV_AZURE_151:Disk encryption is not set here (and this is a Linux VM); it is the existing VM's.
  //checkov:skip=CKV_AZURE_50:Installing the forwarder through the Custom Script Extension is the purpose of this deployment.
  name: vmName
  location: location
  identity: {
    type: identityType
    userAssignedIdentities: userAssignedIdentities
  }
}
